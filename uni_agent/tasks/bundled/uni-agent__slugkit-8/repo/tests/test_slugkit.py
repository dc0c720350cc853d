from slugkit import camel_to_snake, slugify, truncate_words, unique_slug


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  many   spaces  ") == "many-spaces"


def test_slugify_strips_accents():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_slugify_custom_separator():
    assert slugify("Hello World", separator="_") == "hello_world"


def test_slugify_max_length():
    assert slugify("abcdefghij", max_length=4) == "abcd"
    assert slugify("short", max_length=50) == "short"


def test_unique_slug():
    assert unique_slug("My Post", {"my-post", "my-post-2"}) == "my-post-3"
    assert unique_slug("Other", {"my-post"}) == "other"


def test_camel_to_snake():
    assert camel_to_snake("parseHTTPResponse") == "parse_http_response"
    assert camel_to_snake("simple") == "simple"


def test_truncate_words():
    assert truncate_words("one two three", 2) == "one two..."
    assert truncate_words("one two", 5) == "one two"
