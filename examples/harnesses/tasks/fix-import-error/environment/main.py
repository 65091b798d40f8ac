from helpers import tittle_case

print(tittle_case("title case words"))
