"""kforge-tui's benchmark tool: `python -m bench --help` lists the steps (bench/steps/)."""
