"""15 decode rows at position L and a P-token prompt: as two steps (the decode step, then the
prompt's [1, P] chunk) against one mixed forward (every token a row of one, [15 + P, 1]; logits of
the 15 rows and the prompt's last token only, flat logits_at), on the default model's package.
Checks the rows' logits are the same bits both ways, then times each 10 times, three rounds.

    python benchmarks/serve/mixed/step_pair.py L P
"""
import sys, time, torch, fastdecode
llm = fastdecode.load("smollm2-135m-instruct", max_batch_size=16)
llm.generate(["warm up"], max_new_tokens=4, temperature=0)
steps = llm.engine.runner.steps
print("compiled:", steps.compiled)
L = int(sys.argv[1]) if len(sys.argv) > 1 else 150
P = int(sys.argv[2]) if len(sys.argv) > 2 else 123
t = lambda v: torch.tensor(v, dtype=torch.long)
g = torch.Generator().manual_seed(0)
toks = torch.randint(100, 40000, (16, L), generator=g)
with torch.inference_mode():
    steps.step(toks, torch.arange(L).expand(16, L).contiguous(), torch.arange(16), (torch.arange(16) * L + L - 1)[:, None])
    prompt = torch.randint(100, 40000, (1, P), generator=g)
    dec_tok = toks[:15, -1:].contiguous(); dec_pos = torch.full((15, 1), L); dec_rows = torch.arange(15)
    def dec_only():
        return steps.step(dec_tok, dec_pos, dec_rows, torch.arange(15)[:, None])
    def pre_only():
        return steps.step(prompt, torch.arange(P)[None], t([15]), t([[P - 1]]))
    def separate():
        return dec_only(), pre_only()
    mtok = torch.cat([dec_tok, prompt.view(P, 1)])
    mpos = torch.cat([dec_pos, torch.arange(P).view(P, 1)])
    mrows = torch.cat([dec_rows, torch.full((P,), 15)])
    mat = torch.cat([torch.arange(15), t([15 + P - 1])])[:, None]
    def mixed():
        return steps.step(mtok, mpos, mrows, mat)
    a, b = separate()
    m = mixed()
    print("decode rows equal:", torch.equal(m[:15, 0], a[:, 0]), "prompt last equal:", torch.equal(m[15, 0], b[0, 0]))
    for rep in range(3):
        for name, f in (("separate", separate), ("mixed", mixed), ("decode15", dec_only), ("prefill", pre_only)):
            f()
            ts = []
            for _ in range(10):
                s = time.perf_counter(); f(); ts.append(time.perf_counter() - s)
            ts.sort()
            print(f"{name:9s} min {ts[0]*1e3:7.2f} med {ts[5]*1e3:7.2f} ms")
