"""tests/data holds inputs, not this project's tests: the fixture repository's own pytest suite
(repo_fixture/tests) runs only inside `mlx-rlaif data from-repo`'s sandbox."""

collect_ignore_glob = ["repo_fixture/*"]
