"""genrm-trio as a NeMo Gym resources server.

`gym env start --search-dir "$(genrm-trio gym-root)"` runs this file for a
`resources_servers.genrm_trio` block (docs/operations.md in genrm-trio).
"""

from genrm_trio.app.cli import exit_process, gym_main

if __name__ == "__main__":
    exit_process(gym_main())
