from kforge_tui.cli import entry

entry()
