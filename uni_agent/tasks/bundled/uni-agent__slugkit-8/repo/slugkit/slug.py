import re
import unicodedata

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(text, separator="-", max_length=None):
    """Turn ``text`` into a lower-case ASCII slug.

    Accents are stripped, every run of other characters becomes a single
    ``separator`` and the result never starts or ends with ``separator``.
    ``max_length`` limits the length of the returned slug.
    """
    normalized = unicodedata.normalize("NFKD", text)
    ascii_text = normalized.encode("ascii", "ignore").decode("ascii").lower()
    slug = _NON_ALNUM.sub(separator, ascii_text).strip(separator)
    if max_length is not None and len(slug) > max_length:
        slug = slug[:max_length]
    return slug


def unique_slug(text, existing, separator="-"):
    """Slugify ``text`` and add a numeric suffix until it is not in ``existing``."""
    base = slugify(text, separator=separator)
    candidate = base
    n = 2
    while candidate in existing:
        candidate = f"{base}{separator}{n}"
        n += 1
    return candidate
