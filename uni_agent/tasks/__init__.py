"""Task sources that produce dataset rows in the seed schema."""
