"""The packaged build profiles: installed as pipeline.profiles (pyproject.toml maps this folder), found through importlib.resources."""
