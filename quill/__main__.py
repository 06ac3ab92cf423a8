from quill.cli import main

main()
