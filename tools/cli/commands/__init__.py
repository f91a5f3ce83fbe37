"""The `deckhands` sub-commands, one module per group; tools/cli/app.py registers them in the
order `deckhands --help` lists them."""
