"""The token budget of a brief (castore.run.brief): its default, its floor and how tokens are
counted. Apart so that the CLI's parser states them without importing the brief's machinery."""

DEFAULT_BUDGET = 512  # tokens: at most 2,048 bytes of text
# Below this the lines every brief has (clipped to their widths) might not fit.
MIN_BUDGET = 256
TOKEN_RULE = "ceil(utf8_bytes / 4)"  # noqa: S105 - a rule, not a credential
