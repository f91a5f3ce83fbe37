"""deckhands' shared package: the only code that services may import besides their own."""
