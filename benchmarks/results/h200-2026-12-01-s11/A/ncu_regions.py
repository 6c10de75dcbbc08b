"""Session 11, call A: where the atomic dK/dV/dQ kernel's warp-stall samples fall (d = 64, 32 x 32 block).

python ncu_regions.py  (reads ncu_sass.csv.gz, written by ``ncu -i bwd.ncu-rep --page source --csv --print-source sass``):
each inner loop (a backward branch over more than 20 instructions) with its share of the samples and of the
executed instructions.
"""
import csv
import gzip
import re

rows = list(csv.reader(gzip.open("ncu_sass.csv.gz", "rt")))
hdr, body = rows[1], rows[2:]
SRC, SAMPLES, EXEC, ADDR = (hdr.index(h) for h in ("Source", "Warp Stall Sampling (All Samples)",
                                                   "Instructions Executed", "Address"))


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


where = {int(r[ADDR], 16): i for i, r in enumerate(body) if r[ADDR].startswith("0x")}
samples, executed = [num(r[SAMPLES]) for r in body], [num(r[EXEC]) for r in body]
for i, r in enumerate(body):
    m = re.search(r"BRA\s+(?:`\()?(0x[0-9a-f]+)", r[SRC])
    t = where.get(int(m.group(1), 16)) if m else None
    if t is not None and t < i and i - t > 20:
        s, e = sum(samples[t:i + 1]) / sum(samples), sum(executed[t:i + 1]) / sum(executed)
        ffma = sum(executed[j] for j in range(t, i + 1) if "FFMA" in body[j][SRC]) / max(sum(executed[t:i + 1]), 1)
        print(f"instructions {t}-{i}: {s:6.1%} of the samples, {e:6.1%} of the instructions, {ffma:4.0%} FFMA")
