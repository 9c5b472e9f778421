"""Small function apps the functions-host tests drive (not the project's function_app.py)."""
