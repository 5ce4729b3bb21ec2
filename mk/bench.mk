# make bench: see bench/README.md (filled in by the benchmark work).
