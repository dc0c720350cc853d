from .render import FILTERS, TemplateError, render

__all__ = ["FILTERS", "TemplateError", "render"]
