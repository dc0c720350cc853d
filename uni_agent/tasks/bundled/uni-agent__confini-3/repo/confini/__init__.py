from .config import Config
from .parser import ParseError, parse

__all__ = ["Config", "ParseError", "parse"]
