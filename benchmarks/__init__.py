"""Benchmarks comparing gpu_loader with its peers (installed as ``gpu_loader.benchmarks``).

Each module runs as a script (``python benchmarks/<name>.py`` or
``python -m gpu_loader.benchmarks.<name>``), measures every system side by side in one
run, prints a table and writes JSON with machine metadata under ``benchmarks/results/``.
Peer packages are imported inside the functions that use them.
"""
