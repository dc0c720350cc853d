from .parser import parse

_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


class Config:
    def __init__(self, data):
        self._data = data

    @classmethod
    def from_text(cls, text):
        return cls(parse(text))

    @classmethod
    def from_file(cls, path, encoding="utf-8"):
        with open(path, encoding=encoding) as fh:
            return cls.from_text(fh.read())

    def sections(self):
        return list(self._data)

    def get(self, section, key, default=None):
        return self._data.get(section, {}).get(key.lower(), default)

    def get_int(self, section, key, default=None):
        value = self.get(section, key)
        return default if value is None else int(value)

    def get_bool(self, section, key, default=None):
        value = self.get(section, key)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"not a boolean: {value!r}")
