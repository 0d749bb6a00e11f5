"""Which flags of a Megatron-LM (and optionally Pai-Megatron-Patch) checkout `megatron train`
does not know at all: neither implemented nor in src/train/megatron_flag_table.cpp. Run it when
a newer Megatron adds flags, and give each one a row (or an implementation).

  python3 scripts/megatron_flags_check.py MEGATRON_BINARY MEGATRON_LM_DIR [PAI_MEGATRON_PATCH_DIR]

Needs a Python with torch (the venv the tests use has it): Megatron's parser is built by
importing megatron.training.arguments from the checkout.
"""
import argparse, re, subprocess, sys, typing

binary, megatron_dir = sys.argv[1], sys.argv[2]
pai_dir = sys.argv[3] if len(sys.argv) > 3 else None
typing.override = getattr(typing, "override", lambda f: f)  # Megatron uses Python 3.12's typing.override
sys.path.insert(0, megatron_dir)
from megatron.training.arguments import add_megatron_arguments  # noqa: E402

parser = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
add_megatron_arguments(parser)
if pai_dir:
    sys.path.insert(0, pai_dir)
    from megatron_patch.arguments import get_patch_args  # noqa: E402
    get_patch_args(parser)
theirs = {o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}

help_text = subprocess.run([binary, "train", "--help"], capture_output=True, text=True, check=True).stdout
known = set(re.findall(r"--([A-Za-z0-9_-]+)", help_text))
missing = sorted(theirs - known)
print(f"{len(theirs)} flags in the parsers, {len(missing)} unknown to `megatron train`")
for name in missing:
    print("  --" + name)
sys.exit(1 if missing else 0)
