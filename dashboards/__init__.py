"""Reports built from MLflow runs: plots and a self-contained HTML page (`copus report`)."""
