"""The command line, the top floor (nothing in the library imports it): `python -m verify run`,
`run-all` and `faults` (`main`), their options (`options`), the instances and results rows
(`rows`), `run-all` over Ray (`suite`) and the fault-injection campaigns (`faults`)."""
