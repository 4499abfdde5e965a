"""Runs a command and reports how many host cores it kept busy: the CPU seconds (user + system)
of the command and every process it waited for, divided by its wall time.

    python3 benches/cores_busy.py COMMAND [ARGS...]

Prints one line `CORES busy N over W s wall (user U s, system S s)` after the command's own
output and exits with the command's status.
"""
import resource
import subprocess
import sys
import time

if len(sys.argv) < 2:
    sys.exit(__doc__)
start = time.time()
rc = subprocess.call(sys.argv[1:])
wall = time.time() - start
use = resource.getrusage(resource.RUSAGE_CHILDREN)
busy = (use.ru_utime + use.ru_stime) / wall
print(f"CORES busy {busy:.2f} over {wall:.1f} s wall (user {use.ru_utime:.1f} s, system {use.ru_stime:.1f} s)",
      flush=True)
sys.exit(rc)
