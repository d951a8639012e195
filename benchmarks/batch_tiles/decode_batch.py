"""B-stream greedy decode through LLM.generate: python decode_batch.py MODEL B REPEATS (64 new tokens each)."""
import time, sys, fastdecode
llm = fastdecode.load(sys.argv[1])
ids = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)
B=int(sys.argv[2]); prompts = [ids + [100 + i] for i in range(B)]
llm.generate(prompts, max_new_tokens=4, temperature=0)
t=time.perf_counter()
for _ in range(int(sys.argv[3])): out = llm.generate(prompts, max_new_tokens=64, temperature=0)
print(B, sum(len(c.token_ids) for c in out)*int(sys.argv[3])/(time.perf_counter()-t), "tok/s")
