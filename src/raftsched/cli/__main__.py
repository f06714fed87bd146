from raftsched.cli import main

raise SystemExit(main())
