# Developer shortcuts. `pip install rust-just` provides `just` from PyPI.

default: test

# Install the project with its test extras (editable).
install:
    pip install -e '.[test]'

# The README's test command.
test:
    pytest -q

lint:
    ruff check genrm_trio tests benchmarks
    ruff format --check genrm_trio tests benchmarks
    lint-imports

typecheck:
    mypy --strict genrm_trio

# Everything CI runs, in a fresh virtual environment.
ci:
    bash .ci/run

# Simulated judge + service in-process, several 16-rollout groups, one with judge failures.
demo:
    genrm-trio demo

# Serve with a config file; pass extra flags after the file, e.g. `just serve cfg.yaml --port 9000`.
serve config *flags:
    genrm-trio serve --config {{config}} {{flags}}

# Load generator against a running server.
bench *flags:
    genrm-trio bench {{flags}}
