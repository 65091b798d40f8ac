"""Spider-like domain schemas: small tables, verbatim-copyable names, realistic value generators.

Every table's first column is `<table>_id`, an integer primary key; a foreign key column is named
after the table it references (`singer_id` references `singer`), so a join is always
`T1.<parent>_id = T2.<parent>_id`. Tables are kept to 3-5 columns so that `schema_text` stays short:
the prompt of a tiny model has room for little more than the schema and the question.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from typing import Literal

ColumnKind = Literal["pk", "fk", "label", "cat", "num"]


def _words(text: str) -> list[str]:
    return text.split()


_FIRST = _words(
    "Anna Ben Carla David Elena Felix Greta Hugo Ines Jonas Karin Leo Maria Nils Olga Pablo Rosa Sven "
    "Tomas Ursula Victor Wendy Yara Zoe"
)
_LAST = _words("Berg Costa Diaz Engel Fischer Garcia Holm Ito Jensen Kim Lopez Moreau Novak Olsen Park Rossi")
_ADJ = _words("Silent Golden Broken Hidden Distant Crimson Quiet Wild Frozen Secret Lonely Bright")
_NOUN = _words("River Garden Ocean Winter Shadow Harbor Forest Letter Island Bridge Mirror Lantern")
_ORDINAL = _words("North South East West Central Upper Lower Old New Grand")


def _combos(left: list[str] | tuple[str, ...], right: list[str] | tuple[str, ...]) -> list[str]:
    return [f"{a} {b}" for a, b in itertools.product(left, right)]


def _suffixed(left: list[str] | tuple[str, ...], suffix: str) -> list[str]:
    return [f"{a} {suffix}" for a in left]


_CITY = _words("Paris Berlin Madrid Rome Lisbon Vienna Oslo Dublin Prague Warsaw Athens Zurich Boston Denver")
_CITY_NAMES = [
    *_CITY,
    "Austin",
    "Tokyo",
    "Lyon",
    "Milan",
    "Porto",
    "Bergen",
    "Seattle",
    "Chicago",
    "Osaka",
    "Seoul",
]

POOLS: dict[str, list[str]] = {
    "person": _combos(_FIRST, _LAST),
    "title": _combos(_ADJ, _NOUN),
    "country": _words("France Germany Spain Italy Japan Brazil Canada Norway Mexico Egypt"),
    "city": _CITY,
    "color": _words("Red Blue Green Black White Yellow"),
    "venue": _combos(_ORDINAL, ["Hall", "Arena", "Stage"]),
    "airline": _suffixed(_CITY_NAMES, "Air"),
    "flight_no": [f"FL{n}" for n in range(101, 160)],
    "dept": _words("Sales Finance Legal Research Support Marketing Logistics Security Design Quality"),
    "school": _suffixed([*_CITY_NAMES, *_ORDINAL], "High"),
    "restaurant": _combos(
        ["Casa", "Chez", "Little", "Blue", "Red", "Happy"], ["Olive", "Lotus", "Pepper", "Oak"]
    ),
    "dish": _combos(["Spicy", "Sweet", "Smoked", "Fresh", "Grilled"], ["Soup", "Noodles", "Salad", "Tacos"]),
    "club": _suffixed(_CITY_NAMES, "United"),
    "museum": _suffixed(_CITY_NAMES, "Museum"),
    "shop": _combos(_ORDINAL, ["Market", "Store", "Corner"]),
    "product": _combos(["Mini", "Super", "Classic", "Smart", "Eco"], ["Lamp", "Kettle", "Drone", "Puzzle"]),
    "maker": _words("Aurex Bolt Cobra Dynamo Elan Fenix Granit Helix Ionis Jaguna Koru Lynx Mistral Nova"),
    "model": [f"{a}-{n}" for a in ("GT", "RX", "LS", "ZX") for n in range(10, 90, 9)],
    "course": _combos(
        ["Intro", "Applied", "Modern", "Advanced"], ["Algebra", "Optics", "Genetics", "Poetry"]
    ),
    "farm": _combos(
        ["Green", "Sunny", "Willow", "Maple", "Cedar", "Hill", "Brook", "Stone"], ["Farm", "Ranch"]
    ),
    "tag": [f"TAG{n}" for n in range(10, 70)],
    "router": [f"rt-{c.lower()}" for c in _CITY_NAMES],
    "hostname": [f"host{n}" for n in range(1, 60)],
    "dorm": _suffixed(
        ["Oak", "Pine", "Elm", "Birch", "Ash", "Cedar", "Maple", "Willow", "Holly", "Rowan"], "House"
    ),
    "port_name": _suffixed(_CITY_NAMES, "Port"),
    "vessel": _combos(["Sea", "Star", "Blue", "Iron", "Swift"], ["Queen", "Spirit", "Falcon", "Dawn"]),
    "airport_name": _suffixed(_CITY_NAMES, "Field"),
    "runway_code": [f"{n:02d}{s}" for n in range(1, 37, 2) for s in "LRC"],
    "hotel": _combos(["Royal", "Plaza", "Park", "Grand", "Harbor"], ["Inn", "Lodge", "Suites"]),
    "room_number": [str(n) for n in range(101, 150)],
    "station": _suffixed(_CITY_NAMES, "Square"),
    "serial": [f"BK{n}" for n in range(200, 260)],
    "race": _suffixed(_CITY_NAMES, "Marathon"),
    "event": _combos(
        ["Summer", "Winter", "Spring", "Autumn", "Harvest"], ["Clash", "Brawl", "Showdown", "Rumble", "Feud"]
    ),
    "mountain_name": _words("Alder Baro Corvo Dunmar Eldra Falka Gorin Hesta Istra Jorvik Kalma Lumen Morva"),
    "church": _combos(
        ["Saint Anne", "Saint Mark", "Saint Paul", "Saint Clare", "Saint John", "Saint Luke"],
        ["Chapel", "Abbey"],
    ),
    "pastry": _combos(["Apple", "Cherry", "Honey", "Cocoa", "Lemon"], ["Tart", "Roll", "Cake", "Bun"]),
    "card_room": _suffixed(_CITY_NAMES, "Club"),
    "ensemble": _suffixed(_CITY_NAMES, "Philharmonic"),
    "pet_name": _words(
        "Max Bella Luna Rocky Milo Daisy Coco Oscar Ruby Toby Lola Buddy Nala Simba Pepper Ziggy Mocha "
        "Biscuit Shadow Pixel Waffles Pumpkin Socks Noodle"
    ),
}


@dataclass(frozen=True)
class Column:
    """One column; `kind` decides which question templates may use it."""

    name: str
    kind: ColumnKind
    pool: tuple[str, ...] = ()
    low: int = 0
    high: int = 0
    ref: str | None = None

    @property
    def is_text(self) -> bool:
        return self.kind in ("label", "cat")

    def sql_type(self) -> str:
        return "TEXT" if self.is_text else "INTEGER"


@dataclass(frozen=True)
class Table:
    """A table: a primary key, then its foreign keys and value columns (at most 5 columns in all)."""

    name: str
    columns: tuple[Column, ...]
    min_rows: int
    max_rows: int

    @property
    def pk(self) -> str:
        return self.columns[0].name

    @property
    def fks(self) -> list[Column]:
        return [c for c in self.columns if c.kind == "fk"]

    @property
    def label(self) -> Column | None:
        return next((c for c in self.columns if c.kind == "label"), None)

    @property
    def cats(self) -> list[Column]:
        return [c for c in self.columns if c.kind == "cat"]

    @property
    def nums(self) -> list[Column]:
        return [c for c in self.columns if c.kind == "num"]

    @property
    def values(self) -> list[Column]:
        """The columns a question may ask for or filter on (not the keys)."""
        return [c for c in self.columns if c.kind in ("label", "cat", "num")]

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


@dataclass(frozen=True)
class Domain:
    """A Spider-like database design; several databases (`<domain>_<n>`) share it with different rows."""

    name: str
    tables: tuple[Table, ...]
    by_name: dict[str, Table] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {t.name: t for t in self.tables})

    def table(self, name: str) -> Table:
        return self.by_name[name]

    def edges(self) -> list[tuple[Table, Column, Table]]:
        """Every (child, foreign key column, parent) triple: the joins a question may ask for."""
        return [(t, fk, self.table(fk.ref)) for t in self.tables for fk in t.fks if fk.ref is not None]


def _column(spec: str) -> Column:
    """Parse `name*:pool` (label), `name:pool` (category), `name=A|B|C` (category), `name:lo-hi`
    (integer) or `name>table` (foreign key); a compact spec keeps the 29 schemas readable."""
    if ">" in spec:
        name, ref = spec.split(">")
        return Column(name, "fk", ref=ref)
    if "=" in spec:
        name, options = spec.split("=")
        return Column(name, "cat", pool=tuple(options.split("|")))
    name, arg = spec.split(":")
    if arg[0].isdigit():
        low, high = arg.split("-")
        return Column(name, "num", low=int(low), high=int(high))
    if name.endswith("*"):
        return Column(name[:-1], "label", pool=tuple(POOLS[arg]))
    return Column(name, "cat", pool=tuple(POOLS[arg]))


def _table(name: str, rows: tuple[int, int], *specs: str) -> Table:
    columns = (Column(f"{name}_id", "pk"), *(_column(s) for s in specs))
    for c in columns:
        if c.kind == "label" and len(c.pool) < rows[0]:
            raise ValueError(f"{name}.{c.name}: {len(c.pool)} distinct labels cannot fill {rows[0]} rows")
    return Table(name, columns, rows[0], rows[1])


_FEW = (10, 18)
_MID = (14, 28)
_MANY = (20, 40)

DOMAINS: dict[str, Domain] = {
    d.name: d
    for d in [
        Domain(
            "concert_singer",
            (
                _table("singer", _FEW, "name*:person", "country:country", "age:18-65"),
                _table("stadium", _FEW, "name*:venue", "city:city", "capacity:2000-60000"),
                _table(
                    "concert",
                    _MANY,
                    "singer_id>singer",
                    "stadium_id>stadium",
                    "title*:title",
                    "year:2008-2022",
                ),
            ),
        ),
        Domain(
            "pets",
            (
                _table("owner", _FEW, "name*:person", "city:city", "age:18-80"),
                _table(
                    "pet",
                    _MANY,
                    "owner_id>owner",
                    "pet_name*:pet_name",
                    "pet_type=Dog|Cat|Bird|Rabbit",
                    "weight:1-40",
                ),
            ),
        ),
        Domain(
            "flights",
            (
                _table("airline", _FEW, "name*:airline", "country:country", "fleet_size:5-300"),
                _table(
                    "flight",
                    _MANY,
                    "airline_id>airline",
                    "flight_no*:flight_no",
                    "origin:city",
                    "distance:200-9000",
                ),
            ),
        ),
        Domain(
            "employees",
            (
                _table("department", _FEW, "name*:dept", "floor:1-12", "budget:10000-900000"),
                _table(
                    "employee",
                    _MANY,
                    "department_id>department",
                    "name*:person",
                    "role=Engineer|Manager|Analyst|Clerk",
                    "salary:30000-150000",
                ),
            ),
        ),
        Domain(
            "school",
            (
                _table("school", _FEW, "name*:school", "city:city", "founded:1850-2010"),
                _table("student", _MANY, "school_id>school", "name*:person", "grade:1-12", "score:40-100"),
            ),
        ),
        Domain(
            "library",
            (
                _table("author", _FEW, "name*:person", "nationality:country", "birth_year:1900-1995"),
                _table(
                    "book",
                    _MANY,
                    "author_id>author",
                    "title*:title",
                    "genre=Fiction|History|Science|Poetry",
                    "pages:80-900",
                ),
                _table("loan", _MID, "book_id>book", "borrower*:person", "days:1-60"),
            ),
        ),
        Domain(
            "hospital",
            (
                _table(
                    "physician",
                    _FEW,
                    "name*:person",
                    "specialty=Cardiology|Neurology|Surgery|Pediatrics",
                    "years_experience:1-40",
                ),
                _table("patient", _MANY, "physician_id>physician", "name*:person", "age:1-95", "city:city"),
            ),
        ),
        Domain(
            "movies",
            (
                _table("director", _FEW, "name*:person", "country:country", "birth_year:1940-1990"),
                _table(
                    "movie",
                    _MANY,
                    "director_id>director",
                    "title*:title",
                    "genre=Drama|Comedy|Action|Horror",
                    "year:1980-2023",
                ),
                _table("review", _MID, "movie_id>movie", "critic*:person", "stars:1-5"),
            ),
        ),
        Domain(
            "restaurants",
            (
                _table(
                    "restaurant",
                    _FEW,
                    "name*:restaurant",
                    "city:city",
                    "cuisine=Italian|Chinese|Mexican|Indian",
                    "rating:1-5",
                ),
                _table(
                    "dish", _MANY, "restaurant_id>restaurant", "name*:dish", "price:4-60", "calories:150-1500"
                ),
            ),
        ),
        Domain(
            "football",
            (
                _table("club", _FEW, "name*:club", "city:city", "founded:1870-1990"),
                _table(
                    "footballer",
                    _MANY,
                    "club_id>club",
                    "name*:person",
                    "position=Goalkeeper|Defender|Midfielder|Forward",
                    "goals:0-40",
                ),
            ),
        ),
        Domain(
            "museum",
            (
                _table("museum", _FEW, "name*:museum", "city:city", "open_year:1800-2015"),
                _table(
                    "exhibit",
                    _MANY,
                    "museum_id>museum",
                    "title*:title",
                    "category=Sculpture|Fossil|Textile|Coin",
                    "value:1000-900000",
                ),
                _table("visitor", _MID, "museum_id>museum", "name*:person", "age:5-90", "tickets:1-8"),
            ),
        ),
        Domain(
            "shop",
            (
                _table("shop", _FEW, "name*:shop", "city:city", "open_year:1990-2022"),
                _table(
                    "product",
                    _MANY,
                    "shop_id>shop",
                    "name*:product",
                    "category=Toys|Books|Garden|Kitchen",
                    "price:1-500",
                ),
            ),
        ),
        Domain(
            "cars",
            (
                _table("maker", _FEW, "name*:maker", "country:country", "founded:1890-2005"),
                _table(
                    "car",
                    _MANY,
                    "maker_id>maker",
                    "model*:model",
                    "body=Sedan|SUV|Coupe|Van",
                    "horsepower:60-600",
                ),
            ),
        ),
        Domain(
            "courses",
            (
                _table("teacher", _FEW, "name*:person", "subject=Math|Physics|Biology|History", "age:25-70"),
                _table(
                    "course",
                    _MID,
                    "teacher_id>teacher",
                    "title*:course",
                    "credits:1-6",
                    "level=Intro|Core|Advanced",
                ),
                _table("enrollment", _MANY, "course_id>course", "student_name*:person", "score:0-100"),
            ),
        ),
        Domain(
            "farms",
            (
                _table("farm", _FEW, "name*:farm", "city:city", "area:10-2000"),
                _table(
                    "animal", _MANY, "farm_id>farm", "tag*:tag", "species=Cow|Sheep|Goat|Pig", "weight:20-900"
                ),
                _table(
                    "crop",
                    _MID,
                    "farm_id>farm",
                    "crop_name=Wheat|Corn|Barley|Oats",
                    "tons:1-500",
                    "year:2010-2023",
                ),
            ),
        ),
        Domain(
            "network",
            (
                _table("router", _FEW, "name*:router", "location:city", "ports:4-48"),
                _table(
                    "host",
                    _MANY,
                    "router_id>router",
                    "hostname*:hostname",
                    "os=Linux|Windows|BSD|macOS",
                    "uptime_days:0-900",
                ),
            ),
        ),
        Domain(
            "dorms",
            (
                _table("dorm", _FEW, "name*:dorm", "gender=Male|Female|Mixed", "capacity:50-600"),
                _table(
                    "resident",
                    _MANY,
                    "dorm_id>dorm",
                    "name*:person",
                    "major=Math|Biology|Economics|Music",
                    "age:17-30",
                ),
            ),
        ),
        Domain(
            "shipping",
            (
                _table("port", _FEW, "name*:port_name", "country:country", "depth:5-30"),
                _table(
                    "vessel",
                    _MANY,
                    "port_id>port",
                    "name*:vessel",
                    "cargo=Oil|Grain|Containers|Coal",
                    "tonnage:1000-200000",
                ),
            ),
        ),
        Domain(
            "airports",
            (
                _table("airport", _FEW, "name*:airport_name", "city:city", "elevation:0-3000"),
                _table(
                    "runway",
                    _MANY,
                    "airport_id>airport",
                    "code*:runway_code",
                    "length:1500-4500",
                    "surface=Asphalt|Concrete|Grass",
                ),
            ),
        ),
        Domain(
            "hotels",
            (
                _table("hotel", _FEW, "name*:hotel", "city:city", "stars:1-5"),
                _table(
                    "room",
                    _MANY,
                    "hotel_id>hotel",
                    "room_number*:room_number",
                    "room_type=Single|Double|Suite",
                    "price:40-900",
                ),
                _table("guest", _MID, "room_id>room", "name*:person", "nights:1-21", "country:country"),
            ),
        ),
        Domain(
            "bikes",
            (
                _table("station", _FEW, "name*:station", "city:city", "docks:8-60"),
                _table("bike", _MANY, "station_id>station", "serial*:serial", "color:color", "rides:0-5000"),
                _table(
                    "trip", _MANY, "bike_id>bike", "duration:2-180", "rider=Member|Casual", "year:2015-2023"
                ),
            ),
        ),
        Domain(
            "marathon",
            (
                _table("runner", _MID, "name*:person", "country:country", "age:18-70"),
                _table("race", _FEW, "name*:race", "city:city", "year:2000-2023"),
                _table(
                    "result",
                    _MANY,
                    "runner_id>runner",
                    "race_id>race",
                    "finish_minutes:120-400",
                    "place:1-500",
                ),
            ),
        ),
        # Held-out domains below: their table names appear nowhere in the training domains.
        Domain(
            "wrestlers",
            (
                _table("wrestler", _FEW, "name*:person", "country:country", "weight:60-160"),
                _table(
                    "bout", _MANY, "wrestler_id>wrestler", "event*:event", "year:2000-2023", "duration:1-45"
                ),
            ),
        ),
        Domain(
            "gallery",
            (
                _table("painter", _FEW, "name*:person", "country:country", "birth_year:1850-1990"),
                _table(
                    "artwork",
                    _MANY,
                    "painter_id>painter",
                    "title*:title",
                    "medium=Oil|Watercolor|Acrylic|Ink",
                    "price:500-500000",
                ),
                _table(
                    "exhibition",
                    _MID,
                    "artwork_id>artwork",
                    "city:city",
                    "year:1990-2023",
                    "visitors:100-90000",
                ),
            ),
        ),
        Domain(
            "climbing",
            (
                _table("mountain", _FEW, "name*:mountain_name", "country:country", "height:1000-8800"),
                _table(
                    "climber",
                    _MANY,
                    "mountain_id>mountain",
                    "name*:person",
                    "country:country",
                    "points:0-100",
                ),
            ),
        ),
        Domain(
            "weddings",
            (
                _table("church", _FEW, "name*:church", "city:city", "open_year:1700-1990"),
                _table(
                    "wedding", _MANY, "church_id>church", "bride*:person", "year:2000-2023", "guests:20-400"
                ),
            ),
        ),
        Domain(
            "bakery",
            (
                _table("baker", _FEW, "name*:person", "city:city", "years_active:1-40"),
                _table(
                    "pastry",
                    _MANY,
                    "baker_id>baker",
                    "name*:pastry",
                    "flavor=Chocolate|Vanilla|Lemon|Almond",
                    "price:1-25",
                ),
                _table("purchase", _MID, "pastry_id>pastry", "customer*:person", "quantity:1-30"),
            ),
        ),
        Domain(
            "poker",
            (
                _table("card_room", _FEW, "name*:card_room", "city:city", "tables_count:4-80"),
                _table(
                    "poker_player",
                    _MANY,
                    "card_room_id>card_room",
                    "name*:person",
                    "final_tables:0-40",
                    "earnings:1000-900000",
                ),
            ),
        ),
        Domain(
            "orchestra",
            (
                _table("conductor", _FEW, "name*:person", "nationality:country", "age:30-85"),
                _table("orchestra", _FEW, "conductor_id>conductor", "name*:ensemble", "founded:1850-2015"),
                _table(
                    "performance",
                    _MANY,
                    "orchestra_id>orchestra",
                    "piece=Concerto|Symphony|Opera|Ballet",
                    "attendance:100-3000",
                ),
            ),
        ),
    ]
}

HELD_OUT_DOMAIN_NAMES: tuple[str, ...] = (
    "wrestlers",
    "gallery",
    "climbing",
    "weddings",
    "bakery",
    "poker",
    "orchestra",
)

RENAMED_VARIANTS = 8
"""Copies of each training design with other table and column names (`<domain>_r<k>`). With only the
designs' own names a tiny model learns each training schema by heart and writes those names on a
schema it has never seen; renamed copies make copying the names from the prompt the only way."""

_RENAME_POOL = _words(
    "anchor beacon canyon harbor meadow orchard quarry summit valley glacier lagoon prairie ridge "
    "delta fjord grove marsh oasis plateau reef tundra basin cove dune estuary inlet isle knoll "
    "badge crate ledger parcel ticket voucher token permit receipt invoice docket manifest "
    "falcon heron otter badger beaver bison ferret lynx marten osprey puffin raven walrus "
    "amber cobalt copper indigo ivory jade scarlet violet bronze silver "
    "atlas compass lantern quiver saddle spindle trellis kettle ladder mallet "
    "pilot ranger scout sentry steward tutor warden courier envoy herald "
    "cinder ember flint pebble marble slate granite basalt "
    "voyage relay rally parade summit_cup derby regatta gala "
    "tally quota margin ration stipend tariff bounty yield weight depth width length"
)


def _renamed(domain: Domain, k: int, banned: frozenset[str]) -> Domain:
    """Domain `domain` with its tables, and about half of its value columns, renamed from the pool
    (deterministically per copy); keys follow their table's new name, as in the original."""
    rng = random.Random(f"sql-rename:{domain.name}:{k}")
    pool = [w for w in _RENAME_POOL if w not in banned]
    words = iter(rng.sample(pool, len(pool)))
    tables = {t.name: next(words) for t in domain.tables}
    renamed: list[Table] = []
    for t in domain.tables:
        used = {"name"}
        columns: list[Column] = []
        for c in t.columns:
            if c.kind == "pk":
                columns.append(replace(c, name=f"{tables[t.name]}_id"))
            elif c.kind == "fk":
                assert c.ref is not None
                columns.append(replace(c, name=f"{tables[c.ref]}_id", ref=tables[c.ref]))
            elif c.name != "name" and rng.random() < 0.5:
                word = next(w for w in words if w not in used)
                used.add(word)
                columns.append(replace(c, name=word))
            else:
                columns.append(c)
        renamed.append(Table(tables[t.name], tuple(columns), t.min_rows, t.max_rows))
    return Domain(f"{domain.name}_r{k}", tuple(renamed))


def _with_renamed_copies(domains: dict[str, Domain], held_out: tuple[str, ...]) -> dict[str, Domain]:
    banned = frozenset(
        name for d in held_out for t in domains[d].tables for name in (t.name, *(c.name for c in t.columns))
    )
    copies = {
        f"{d.name}_r{k}": _renamed(d, k, banned)
        for d in domains.values()
        if d.name not in held_out
        for k in range(RENAMED_VARIANTS)
    }
    return {**domains, **copies}


DOMAINS = _with_renamed_copies(DOMAINS, HELD_OUT_DOMAIN_NAMES)

INSTANCES_PER_DOMAIN = 4
"""Databases per domain: the same design with different rows, so one query form has several answers."""


def domain_of(db_id: str) -> Domain:
    """The design behind `<domain>_<n>`; raises KeyError for an unknown id."""
    name, _, index = db_id.rpartition("_")
    if not index.isdigit() or name not in DOMAINS:
        raise KeyError(f"unknown db_id {db_id!r}; expected <domain>_<n> with a domain of {sorted(DOMAINS)}")
    return DOMAINS[name]


def db_ids(domain: str) -> list[str]:
    return [f"{domain}_{i}" for i in range(INSTANCES_PER_DOMAIN)]


def schema_text(db_id_or_domain: str) -> str:
    """The compact schema the prompt carries: `t(a, b -> parent, c) | u(...)`, keys marked by name only."""
    domain = DOMAINS.get(db_id_or_domain) or domain_of(db_id_or_domain)
    parts = []
    for t in domain.tables:
        cols = ", ".join(f"{c.name} -> {c.ref}" if c.kind == "fk" else c.name for c in t.columns)
        parts.append(f"{t.name}({cols})")
    return " | ".join(parts)


def schema_ddl(domain: Domain) -> list[str]:
    """CREATE TABLE statements with declared REFERENCES, parents before children."""
    statements = []
    for t in domain.tables:
        cols = []
        for c in t.columns:
            if c.kind == "pk":
                cols.append(f"{c.name} INTEGER PRIMARY KEY")
            elif c.kind == "fk":
                cols.append(f"{c.name} INTEGER NOT NULL REFERENCES {c.ref}({c.name})")
            else:
                cols.append(f"{c.name} {c.sql_type()} NOT NULL")
        statements.append(f"CREATE TABLE {t.name} ({', '.join(cols)})")
    return statements


def generate_rows(domain: Domain, rng: random.Random) -> dict[str, list[tuple[object, ...]]]:
    """Rows for every table, parents first. A child draws its foreign keys from about three quarters of
    the parent ids, so "which parents have no children" (NOT IN) has an answer."""
    rows: dict[str, list[tuple[object, ...]]] = {}
    for t in domain.tables:
        n = rng.randint(t.min_rows, t.max_rows)
        label = t.label
        if label is not None:
            n = min(n, len(label.pool))
        labels = rng.sample(label.pool, n) if label is not None else []
        parents: dict[str, list[int]] = {}
        for fk in t.fks:
            assert fk.ref is not None
            ids = [int(str(r[0])) for r in rows[fk.ref]]
            parents[fk.name] = rng.sample(ids, max(1, round(len(ids) * 0.75)))
        table_rows: list[tuple[object, ...]] = []
        for i in range(n):
            values: list[object] = []
            for c in t.columns:
                if c.kind == "pk":
                    values.append(i + 1)
                elif c.kind == "fk":
                    values.append(rng.choice(parents[c.name]))
                elif c.kind == "label":
                    values.append(labels[i])
                elif c.kind == "cat":
                    values.append(rng.choice(c.pool))
                else:
                    values.append(rng.randint(c.low, c.high))
            table_rows.append(tuple(values))
        rows[t.name] = table_rows
    return rows
