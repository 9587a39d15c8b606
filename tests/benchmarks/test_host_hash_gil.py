"""benchmarks/host_hash_gil.py runs as its docstring says: both ways of feeding the hash give the layout's
chain, and it prints a row per way and neighbour (the times are the benchmark's, not asserted)."""

from tests.benchmarks.scripts import run_script


def test_the_hash_benchmark_compares_both_feedings():
    done = run_script("host_hash_gil.py", "--tokens", "5000", "--repeats", "1", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "ms per chain" not in line]
    assert [r.split("|")[1:3] for r in rows] == [
        [" whole chunks ", " none "],
        [" whole chunks ", " a busy thread "],
        [" layout (pieces) ", " none "],
        [" layout (pieces) ", " a busy thread "],
    ]
