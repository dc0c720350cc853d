from .slug import slugify, unique_slug
from .text import camel_to_snake, truncate_words

__all__ = ["camel_to_snake", "slugify", "truncate_words", "unique_slug"]
