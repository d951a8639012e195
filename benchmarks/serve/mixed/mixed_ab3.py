"""16 streams in one engine (32 prompts of 40-200 words, 64 greedy tokens, 16 slots, no prefix
cache), three ways in rotating order: "both" (mixed steps, prompts of different lengths sharing a
step), "mixed" (Scheduler.ragged off), "none" (that and Runner.mixes patched to refuse; the
patches are this measurement's only). Prints tokens/s per run."""
import random, sys, time
import fastdecode
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "near an old river bank full of bright stones and tall green reeds").split()
llm = fastdecode.load(max_batch_size=16, prefix_cache=False)
runner, sched = llm.engine.runner, llm.engine.scheduler
mixes = runner.mixes
gen = dict(max_new_tokens=64, temperature=0, ignore_eos=True)
llm.generate(["warm up", "and again"], **{**gen, "max_new_tokens": 8})
R = int(sys.argv[1]) if len(sys.argv) > 1 else 3
modes = ["both", "mixed", "none"]
res = {m: [] for m in modes}
for i in range(R):
    rng = random.Random(i)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200))) for _ in range(32)]
    for mode in modes[i % 3:] + modes[:i % 3]:
        sched.ragged = mode == "both"
        runner.mixes = mixes if mode != "none" else (lambda *a: False)
        m0, s0 = llm.engine.mixed_steps, llm.engine.steps_run
        t = time.perf_counter()
        n = sum(len(c.token_ids) for c in llm.generate(prompts, **gen))
        w = time.perf_counter() - t
        res[mode].append(n / w)
        print(f"run {i} {mode}: {n / w:.1f} tok/s, {llm.engine.steps_run - s0} steps, {llm.engine.mixed_steps - m0} mixed",
              flush=True)
for k, v in res.items():
    print(k, [round(x, 1) for x in v])
