"""Everything that talks to TensorRT or reads what it wrote. `import tensorrt` happens only here, lazily."""
