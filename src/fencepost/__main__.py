from fencepost.cli import main

main()
