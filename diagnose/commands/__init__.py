"""One small module per subcommand; each has add_arguments(parser) and execute(args) -> int."""
