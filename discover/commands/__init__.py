"""One module per `discover` subcommand; discover.cli registers them."""
