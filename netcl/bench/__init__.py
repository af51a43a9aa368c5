"""Benchmarks behind `netcl bench NAME`: one module per name, each with run(args) -> dict."""
