"""16 streams in one engine (32 prompts of 40-200 words, 64 greedy tokens, 16 slots, no prefix
cache), mixed steps on and off alternately (off: Runner.mixes patched to False, this measurement
only). Prints tokens/s per run."""
import random, sys, time
import fastdecode
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "near an old river bank full of bright stones and tall green reeds").split()
llm = fastdecode.load(max_batch_size=16, prefix_cache=False)
runner = llm.engine.runner
mixes = runner.mixes
gen = dict(max_new_tokens=64, temperature=0, ignore_eos=True)
llm.generate(["warm up", "and again"], **{**gen, "max_new_tokens": 8})
R = int(sys.argv[1]) if len(sys.argv) > 1 else 3
res = {"on": [], "off": []}
for i in range(R):
    rng = random.Random(i)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200))) for _ in range(32)]
    for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
        runner.mixes = mixes if mode == "on" else (lambda *a: False)
        m0 = llm.engine.mixed_steps; s0 = llm.engine.steps_run
        t = time.perf_counter()
        n = sum(len(c.token_ids) for c in llm.generate(prompts, **gen))
        w = time.perf_counter() - t
        res[mode].append(n / w)
        print(f"run {i} {mode}: {n / w:.1f} tok/s, {llm.engine.steps_run - s0} steps, {llm.engine.mixed_steps - m0} mixed", flush=True)
for k, v in res.items():
    print(k, [round(x, 1) for x in v])
