"""Benchmark: idle OpenMP threads when jobs share the cores (why the Snakefile sets
OMP_WAIT_POLICY=PASSIVE).

`make demo` runs `snakemake --cores 8`; on a 2-core machine that is up to 4 heavy jobs of 2
threads each at once. Each job here is a separate process running 200 forward passes of a
32 x 32 batch through a demo-shaped random GPT-2 (3 layers, d_model 64: the demo model's
shape) with 2 torch threads; 4 of them run at once, with OpenMP's default wait policy
(idle threads spin) and with OMP_WAIT_POLICY=PASSIVE (idle threads sleep), then with 1
thread each. The total CPU seconds of the 4 processes' passes are printed. Then one job
alone on a GPT-2-small-shaped model (1 x 1024 passes, 2 threads) under both policies: a
lone job must not get slower.

    export PYTHONPATH=$PWD/src; .venv/bin/python bench/threads.py [/tmp/posmech-study/gpt2-random]
"""
import os
import subprocess
import sys
import tempfile
import time

JOB = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
from posmech.models.loading import load_model
m = load_model({"hf_dir": sys.argv[1], "name": "x"}, "cpu", engine="posmech")
n, shape = int(sys.argv[3]), tuple(map(int, sys.argv[4].split("x")))
x = torch.randint(0, 60, shape)
with torch.inference_mode():
    m(x)
    c0 = time.process_time()
    for _ in range(n):
        m(x)
print(time.process_time() - c0)
"""


def demo_shaped(path: str) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel

    from posmech.models.handbuilt import char_tokenizer

    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    char_tokenizer(64).save_pretrained(path)
    return path


def jobs(model: str, n_jobs: int, threads: int, policy: str | None, passes: int, shape: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    procs = [subprocess.Popen([sys.executable, "-c", JOB, model, str(threads), str(passes), shape], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(n_jobs)]
    return sum(float(p.communicate()[0]) for p in procs)


def main() -> None:
    big = sys.argv[1] if len(sys.argv) > 1 else "/tmp/posmech-study/gpt2-random"
    with tempfile.TemporaryDirectory() as tmp:
        small = demo_shaped(os.path.join(tmp, "demo-shaped"))
        print(f"{os.cpu_count()} cores; 4 jobs at once, 200 passes of 32x32 each (demo-shaped model):")
        for threads, policy in ((2, None), (2, "PASSIVE"), (1, None), (1, "PASSIVE")):
            t0 = time.time()
            cpu = jobs(small, 4, threads, policy, 200, "32x32")
            print(f"  {threads} thread(s), OMP_WAIT_POLICY={policy or 'default (spin)':16s} "
                  f"{cpu:7.2f} CPU s in all, {time.time() - t0:5.1f} s wall")
    if os.path.isdir(big):
        print("one job alone, 4 passes of 1x1024 (GPT-2-small-shaped stand-in), 2 threads, CPU s per pass:")
        for rnd in (1, 2):
            for policy in (None, "PASSIVE"):
                print(f"  round {rnd}, {policy or 'default (spin)':16s} {jobs(big, 1, 2, policy, 4, '1x1024') / 4:.2f}")
    else:
        print(f"(no {big}: run bench/study.py first for the lone-job check)")


if __name__ == "__main__":
    main()
