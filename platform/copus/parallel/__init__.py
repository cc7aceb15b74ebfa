"""Worker-side parallelism on torch.distributed: meshes and groups are always passed in."""
