def greeting(name: str) -> str:
    return f"Hello, {name}!"
