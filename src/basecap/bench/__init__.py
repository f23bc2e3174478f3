"""Speed and memory benchmarks: each module has ``main(argv)`` and writes JSON (and a plot where useful)."""
