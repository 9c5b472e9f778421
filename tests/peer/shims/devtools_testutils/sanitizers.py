"""No test proxy: sanitizers are no-ops."""


def add_remove_header_sanitizer(*args, **kwargs):
    pass


def add_general_regex_sanitizer(*args, **kwargs):
    pass


def add_oauth_response_sanitizer(*args, **kwargs):
    pass
