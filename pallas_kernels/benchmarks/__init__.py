"""CPU benchmarks for the scans and attention (markdown tables on stdout)."""
