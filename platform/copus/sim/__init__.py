"""The simulator front end: its YAML (`config`) and the run that prints and writes results (`run`); the pure engine is `copus.core.simulator`."""
