import re

_TAG = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*(?:\|\s*(\w+)\s*)?\}\}")

FILTERS = {
    "upper": str.upper,
    "lower": str.lower,
    "title": str.title,
    "strip": str.strip,
}

_MISSING = object()


class TemplateError(Exception):
    pass


def _lookup(context, dotted):
    value = context
    for part in dotted.split("."):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        else:
            value = getattr(value, part, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def render(template, context, strict=False):
    """Replace ``{{ name }}`` / ``{{ name | filter }}`` tags using ``context``."""

    def replace(match):
        name, filter_name = match.groups()
        value = _lookup(context, name)
        if value is _MISSING:
            if strict:
                raise TemplateError(f"undefined name: {name}")
            value = None
        text = str(value or "")
        if filter_name:
            try:
                text = FILTERS[filter_name](text)
            except KeyError:
                raise TemplateError(f"unknown filter: {filter_name}") from None
        return text

    return _TAG.sub(replace, template)
