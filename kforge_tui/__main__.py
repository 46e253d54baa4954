from kforge_tui.cli import main

raise SystemExit(main())
