"""More training prompts for self-distillation, built from templates (deterministic, offline).

The drafters learn from the target's own answers (distill.py), so more prompts means more of what the
target actually says. The hand-written `distill.PROMPTS` cover the five workloads in breadth; these add
volume where speculation is benchmarked hardest (code and structured output) and keep the other workloads
in proportion. None of them is a benchmark or held-out prompt (`expanded()` drops any that are, and a test
checks the benchmark files stay unseen).
"""
from __future__ import annotations

import itertools
import random

LANGS = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "Ruby", "PHP", "Kotlin", "Swift"]

TASKS = [
    "returns the sum of the digits of an integer", "reverses the words in a sentence",
    "returns the largest of three numbers", "counts how many times a character appears in a string",
    "checks whether a year is a leap year", "converts a number of minutes into hours and minutes",
    "returns the average of a list of numbers", "finds the smallest element of an array",
    "removes all spaces from a string", "returns the last n elements of a list",
    "checks whether a list is sorted in ascending order", "computes the power of a number without a library call",
    "returns the index of the first negative number, or -1", "joins a list of strings with commas",
    "converts a string to title case", "returns the number of words in a sentence",
    "checks whether all characters in a string are digits", "computes the area of a circle from its radius",
    "returns the distance between two points", "swaps the first and last elements of an array",
    "rotates a list to the left by k positions", "returns the intersection of two lists",
    "counts the positive numbers in an array", "builds a multiplication table for n as a list of strings",
    "checks whether a number is a perfect square", "returns the median of three numbers",
    "converts Celsius to Fahrenheit", "capitalizes every other letter of a string",
    "returns the product of all numbers in a list", "computes the number of days between two dates",
    "replaces every vowel in a string with an asterisk", "checks whether a string contains only letters",
    "returns the cumulative sums of a list", "finds the most common element in a list",
    "truncates a string to n characters and adds an ellipsis", "converts a binary string to an integer",
    "returns all pairs in a list that add up to a target", "checks whether two lists have the same elements",
    "returns the n-th Fibonacci number iteratively", "removes the None values from a list",
    "computes a simple interest amount", "groups a list of words by their first letter",
    "checks whether a password is at least 8 characters long and contains a digit",
    "returns the longest common prefix of a list of strings", "counts the lines in a text",
    "clamps a number between a minimum and a maximum", "returns a list of the squares of the odd numbers",
    "converts a dictionary's keys to upper case", "returns the difference between the largest and smallest value",
]

CLASSES = [
    ("Stack of integers", "push, pop and size"), ("Counter", "increment, reset and value"),
    ("Temperature", "celsius and a fahrenheit property"), ("Book", "title, author and a describe method"),
    ("Circle", "radius, area and perimeter"), ("TodoList", "add, remove and list items"),
    ("Timer", "start, stop and elapsed"), ("Inventory", "add_item, remove_item and total_count"),
    ("Student", "name, grades and an average method"), ("Matrix2x2", "addition and a determinant"),
    ("LinkedList", "append, prepend and to_list"), ("ShoppingCart", "add, remove and total"),
]

SQL = [
    "selects all customers from the city 'Paris'", "counts the rows in a table `orders`",
    "finds the average salary per department", "deletes the users who never logged in",
    "updates the price of the product with id 7 to 19.99", "lists the ten most recent orders",
    "finds the employees hired in 2020", "returns the total sales per month",
    "selects the products whose name starts with 'A'", "finds duplicate email addresses in `users`",
    "creates a table `books` with id, title, author and year", "joins `orders` and `customers` on customer_id",
]

SHELL = [
    "prints the current date and the number of files in the current directory",
    "renames every .jpeg file in a folder to .jpg", "checks whether a file exists and prints a message",
    "loops over the numbers 1 to 5 and prints each", "counts the words in a file given as an argument",
    "deletes log files older than 7 days",
]

THINGS = [
    ("a person", "name, age, email and a list of hobbies"), ("a city", "name, country, population and landmarks"),
    ("a phone", "brand, model, storage_gb, price and colors"), ("a restaurant", "name, cuisine, rating and address"),
    ("a course", "code, title, credits and a list of prerequisites"), ("a tree", "species, height_m, age_years"),
    ("a podcast episode", "title, host, duration_minutes and guests"), ("a bank transaction",
                                                                          "id, amount, currency, date and type"),
    ("a planet", "name, diameter_km, moons and has_rings"), ("a video game", "title, genre, platforms and year"),
    ("a train", "number, origin, destination, departure and delay_minutes"),
    ("a house", "address, rooms, area_m2, price and for_sale"), ("a company", "name, founded, employees, ceo"),
    ("an invoice", "number, client, lines (each with description and amount) and total"),
    ("a sensor reading", "sensor_id, timestamp, temperature and humidity"),
    ("a cat", "name, color, age and indoor"), ("a board game", "name, min_players, max_players and minutes"),
    ("a job posting", "title, company, location, salary_range and skills"),
    ("a medication", "name, dose_mg, times_per_day and with_food"), ("a parking lot", "id, capacity, free_spots"),
    ("a coffee order", "size, drink, milk, sugar and price"), ("a mountain", "name, height_m, range, first_ascent"),
    ("a smartwatch", "brand, battery_days, water_resistant and sensors"),
    ("a festival", "name, city, start_date, end_date and headliners"),
    ("a server", "hostname, ip, cpu_cores, memory_gb and status"),
    ("an email", "from, to, subject, body and attachments"), ("a playlist", "name, owner and songs (title, artist)"),
    ("a gym membership", "member, plan, start_date and active"), ("a river", "name, length_km, countries"),
    ("an apartment listing", "city, rent, bedrooms, furnished and available_from"),
]

PHRASINGS = [
    "Return a JSON object describing {t} with {f}.",
    "Give me {t} as JSON with the keys {f}.",
    "Write a JSON object for {t}: {f}.",
]
LISTS = [
    "Give a JSON array of {n} {p}, each with {f}.",
]
PLURALS = [
    ("animals", "name, habitat and diet"), ("cities", "name and country"), ("colors", "name and hex"),
    ("movies", "title and year"), ("vegetables", "name and color"), ("languages", "name and speakers_millions"),
    ("sports", "name and players_per_team"), ("tools", "name and use"), ("rivers", "name and length_km"),
    ("inventors", "name and invention"), ("elements", "name, symbol and atomic_number"),
    ("desserts", "name and main_ingredient"),
]
PEOPLE = ["Ali", "Bea", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jonas", "Kofi", "Lucia"]
JOBS = ["nurse", "pilot", "teacher", "baker", "engineer", "lawyer", "farmer", "painter"]
PLACES = ["Oslo", "Lima", "Cairo", "Seoul", "Dublin", "Quito", "Hanoi", "Porto", "Accra", "Perth"]

TOPICS = ["the ocean at night", "an old lighthouse", "a busy train station", "autumn leaves", "a lost kitten",
          "a robot gardener", "the first day of spring", "a quiet library", "a thunderstorm", "a city bridge",
          "a paper boat", "the northern lights", "a village bakery", "a snowy owl", "a desert well",
          "a kite festival", "a forgotten violin", "a space station", "a fox in the snow", "a summer market"]
QUESTIONS = ["What is {x}?", "Explain {x} in two sentences.", "Why is {x} important?"]
CONCEPTS = ["photosynthesis", "inflation", "a compiler", "the immune system", "an ecosystem", "a database index",
            "democracy", "electricity", "the internet", "a leap year", "a volcano", "compound interest",
            "a hash function", "the moon's phases", "evaporation", "a neural network", "friction", "DNA",
            "a budget", "a time zone"]
FACTS = [
    "The museum opens at 10, closes at 18 and charges 12 euros for adults.",
    "Our team of six will meet in Room 4 on Friday at 2 pm to plan the launch.",
    "The river Nile is about 6,650 km long and flows through eleven countries.",
    "Order 4471 shipped on 3 March from Rotterdam and arrives on 9 March in Austin.",
    "The new library has 120,000 books, 40 computers and a cafe on the ground floor.",
    "Jana Novak, 41, is a dentist in Brno and has two children, Petr and Eva.",
    "The laptop weighs 1.3 kg, has 16 GB of memory and a battery that lasts 14 hours.",
    "The concert by the Blue Notes starts at 8 pm at the Harbour Hall; tickets cost 35 dollars.",
]
EXTRACTS = ["Extract the numbers from this text: {s}", "List the names and places mentioned in: {s}",
            "Summarize in one sentence: {s}", "Convert this text to JSON: {s}",
            "Extract the key facts as a bulleted list: {s}"]


def _code() -> list[str]:
    out = [f"Write a {lang} function that {task}." for lang, task in itertools.product(LANGS[:6], TASKS)]
    out += [f"Write a {lang} function that {task}." for lang, task in zip(itertools.cycle(LANGS[6:]), TASKS)]
    out += [f"Write a Python class `{name.split()[0]}` with {what}." for name, what in CLASSES]
    out += [f"Write a JavaScript class `{name.split()[0]}` with {what}." for name, what in CLASSES]
    out += [f"Write a SQL query that {q}." for q in SQL]
    out += [f"Write a bash script that {s}." for s in SHELL]
    out += [f"Write a Python function that {task}, with type hints and a docstring." for task in TASKS[::2]]
    return out


def _json() -> list[str]:
    out = [p.format(t=t, f=f) for (t, f), p in itertools.product(THINGS, PHRASINGS)]
    out += [LISTS[0].format(n=n, p=p, f=f) for (p, f), n in zip(PLURALS, itertools.cycle(["two", "three", "four"]))]
    rng = random.Random(0)
    for name in PEOPLE:
        job, place, age = rng.choice(JOBS), rng.choice(PLACES), rng.randint(21, 70)
        out.append(f"Convert to JSON with keys name, age, job and city: {name} is a {age}-year-old {job} in {place}.")
        out.append(f"Turn this into a JSON object: {name}, {job}, lives in {place}, age {age}.")
    out += [f"Write a YAML file describing {t} with {f}." for t, f in THINGS[:8]]
    return out


def _other() -> list[str]:
    out = [q.format(x=x) for x, q in zip(CONCEPTS, itertools.cycle(QUESTIONS))]
    out += [f"Write a short poem about {t}." for t in TOPICS[:10]]
    out += [f"Tell a short story about {t}." for t in TOPICS[10:]]
    out += [e.format(s=s) for s, e in zip(FACTS * 2, itertools.cycle(EXTRACTS))]
    return out


def expanded(exclude: set[str] = frozenset()) -> list[str]:
    """All template prompts in a fixed order, minus any in `exclude` (benchmark and held-out prompts)."""
    seen, out = set(exclude), []
    for p in _code() + _json() + _other():
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


# A second group, added once the first had been trained on (its answers cached apart, so adding it regenerated
# nothing): requests phrased the way people ask for code and JSON: a named signature in backticks, typed
# fields, concrete values. Distinct from the fresh evaluation prompts (docs/fresh-prompts.jsonl), which are
# excluded by text like the benchmark files.
SIGNATURES = [
    ("word_lengths(words)", "returns a dictionary mapping each word to its length"),
    ("flatten(nested)", "flattens a list of lists into one list"),
    ("dedupe(xs)", "removes duplicates from a list while keeping the first occurrence order"),
    ("count_words(text)", "returns how many times each word appears in a text, ignoring case"),
    ("is_palindrome(s)", "checks whether a string reads the same backwards, ignoring spaces and case"),
    ("pairwise_sums(xs)", "returns the sums of each pair of neighbouring elements"),
    ("top_n(scores, n)", "returns the n highest values of a list in descending order"),
    ("safe_divide(a, b)", "divides a by b and returns None when b is zero"),
    ("parse_kv(line)", "parses a string like 'a=1;b=2' into a dictionary"),
    ("to_snake_case(name)", "converts a CamelCase name to snake_case"),
    ("chunk_string(s, n)", "splits a string into pieces of length n"),
    ("transpose(matrix)", "transposes a matrix given as a list of lists"),
    ("invert_dict(d)", "swaps the keys and values of a dictionary"),
    ("moving_average(xs, k)", "returns the averages of every window of k consecutive values"),
    ("first_repeated(s)", "returns the first character that appears twice in a string, or None"),
    ("group_by_length(words)", "groups words into a dictionary keyed by their length"),
    ("clip_list(xs, lo, hi)", "limits every value of a list to the range lo..hi"),
    ("count_evens(xs)", "returns how many even numbers a list holds"),
    ("char_frequency(s)", "returns a dictionary of how often each character occurs"),
    ("merge_sorted(a, b)", "merges two sorted lists into one sorted list without sorting again"),
    ("binary_search(xs, target)", "returns the index of target in a sorted list, or -1"),
    ("gcd(a, b)", "returns the greatest common divisor of two integers with Euclid's algorithm"),
    ("digits(n)", "returns the decimal digits of a non-negative integer as a list"),
    ("zip_dict(keys, values)", "builds a dictionary from a list of keys and a list of values"),
    ("second_largest(xs)", "returns the second largest distinct value of a list"),
    ("split_even_odd(xs)", "returns two lists, the even numbers and the odd numbers"),
    ("normalize(xs)", "scales a list of numbers so that they sum to one"),
    ("longest_word(text)", "returns the longest word of a sentence"),
    ("cumulative_product(xs)", "returns the running products of a list"),
    ("rle_encode(s)", "run-length encodes a string, so 'aaab' becomes 'a3b1'"),
    ("rle_decode(s)", "decodes a run-length encoded string like 'a3b1'"),
    ("filter_keys(d, keys)", "returns a copy of a dictionary with only the given keys"),
    ("sum_nested(d)", "sums all the numbers in a dictionary whose values may be dictionaries too"),
    ("is_anagram(a, b)", "checks whether two words are anagrams of each other"),
    ("unique_chars(s)", "checks whether every character of a string is different"),
    ("index_of_max(xs)", "returns the index of the largest element of a list"),
    ("repeat_each(xs, n)", "repeats every element of a list n times in place"),
    ("percent_change(old, new)", "returns the percentage change from old to new, rounded to two decimals"),
    ("mask_email(email)", "hides all but the first letter of the name part of an email address"),
    ("sort_by_age(people)", "sorts a list of dictionaries with a 'name' and an 'age' by age"),
    ("days_in_month(year, month)", "returns the number of days in a month, leap years included"),
    ("roman_to_int(s)", "converts a Roman numeral to an integer"),
    ("int_to_binary(n)", "returns the binary representation of a non-negative integer as a string"),
    ("valid_brackets(s)", "checks whether the brackets (), [] and {} in a string are balanced"),
    ("word_wrap(text, width)", "wraps a text into lines of at most width characters"),
    ("nth_prime(n)", "returns the n-th prime number"),
    ("count_upper(s)", "counts the upper-case letters of a string"),
    ("average_by_key(rows, key)", "averages the values under one key of a list of dictionaries"),
    ("remove_falsy(xs)", "removes every falsy value from a list"),
    ("interleave(a, b)", "interleaves two lists element by element"),
]

OTHER_LANGS = ["JavaScript", "TypeScript", "Go", "Rust", "Java", "C#"]   # camelCase names but in Rust

FIELDS = [
    ("a laptop", "brand, model, ram_gb (a number), ports (a list of strings) and in_stock (a boolean)"),
    ("a concert ticket", "artist, venue, date, seat and price"),
    ("a weather forecast", "city, date, high_c, low_c and conditions (a list of strings)"),
    ("a user profile", "username, email, age, verified (a boolean) and interests (a list of strings)"),
    ("a flight", "number, airline, from, to, departure and on_time (a boolean)"),
    ("a recipe", "name, servings, minutes and ingredients (a list of strings)"),
    ("a hotel booking", "guest, hotel, nights, room_type and paid (a boolean)"),
    ("a car", "make, model, year, electric (a boolean) and colors (a list of strings)"),
    ("a library loan", "book_title, borrower, due_date and returned (a boolean)"),
    ("a support ticket", "id, title, priority, status and tags (a list of strings)"),
    ("a museum", "name, city, founded, free_entry (a boolean) and collections (a list of strings)"),
    ("a product review", "product, rating (1 to 5), title, text and helpful_votes"),
    ("an employee", "id, name, department, salary and skills (a list of strings)"),
    ("a marathon result", "runner, bib, time, age_group and finished (a boolean)"),
    ("a shipment", "tracking_number, carrier, weight_kg, destination and delivered (a boolean)"),
    ("a to-do item", "id, title, due, done (a boolean) and labels (a list of strings)"),
    ("a song", "title, artist, album, year and duration_seconds"),
    ("a country", "name, capital, population, languages (a list of strings) and landlocked (a boolean)"),
    ("a bicycle", "brand, type, gears, weight_kg and accessories (a list of strings)"),
    ("a network device", "hostname, ip, mac, online (a boolean) and open_ports (a list of numbers)"),
]

VALUES = [
    ("a movie", "title, director, year and genres (a list of strings)", "the movie 'Alien' by Ridley Scott, 1979"),
    ("a person", "name, age, city and languages (a list of strings)", "Marta, 34, from Madrid, speaks Spanish and English"),
    ("a product", "name, price, currency and in_stock (a boolean)", "a blue mug at 8.50 euros, in stock"),
    ("a meeting", "title, date, start, end and attendees (a list of strings)",
     "the budget review on 12 May from 10:00 to 11:00 with Ana, Ben and Carl"),
    ("a book", "title, author, pages and available (a boolean)", "'Emma' by Jane Austen, 474 pages, available"),
    ("a city", "name, country, population and rivers (a list of strings)", "Prague, Czechia, 1.3 million, the Vltava"),
    ("an order", "id, customer, items (a list of strings) and total", "order 991 for Li Wei: a lamp and two bulbs, 42 dollars"),
    ("a game", "title, studio, year and platforms (a list of strings)", "'Portal' by Valve, 2007, on PC and Xbox"),
]

PLURAL_FIELDS = [
    ("countries", "name, capital and population"), ("fruits", "name, color and calories"),
    ("programming languages", "name, year and typed (a boolean)"), ("books", "title, author and year"),
    ("cars", "make, model and year"), ("employees", "name, role and salary"),
    ("songs", "title, artist and seconds"), ("birds", "name, wingspan_cm and migrates (a boolean)"),
    ("mountains", "name, height_m and country"), ("students", "name, grade and passed (a boolean)"),
    ("oceans", "name and area_km2"), ("coins", "name, symbol and price_usd"),
]


def more() -> list[str]:
    """The second group: code with named signatures, JSON with typed fields and given values."""
    out = [f"Write a Python function `{sig}` that {task}." for sig, task in SIGNATURES]
    out += [f"Write a Python function `{sig}` that {task}. Include a docstring and type hints." for sig, task in
            SIGNATURES[::3]]
    out += [f"Write a Python function `{sig}` that {task}, and show one example call." for sig, task in
            SIGNATURES[1::3]]
    out += [f"Write a {lang} function `{_named(sig, lang)}` that {task}." for (sig, task), lang in
            zip(SIGNATURES, itertools.cycle(OTHER_LANGS))]
    out += [f"Return a JSON object for {t} with the fields {f}." for t, f in FIELDS]
    out += [f"Give a JSON object describing {t} with {f}." for t, f in FIELDS[::2]]
    out += [f"Return a JSON object describing {t} with the fields {f}. Use {v}." for t, f, v in VALUES]
    out += [f"Give a JSON array of {n} {p}, each an object with {f} fields." for (p, f), n in
            zip(PLURAL_FIELDS, itertools.cycle(["two", "three", "four", "five"]))]
    return out


def _named(sig: str, lang: str) -> str:
    """A Python signature as `lang` names its functions: snake_case kept in Rust, camelCase elsewhere."""
    return sig if lang == "Rust" else _camel(sig)


def _camel(sig: str) -> str:
    """word_lengths(words) -> wordLengths(words)"""
    name, rest = sig.split("(", 1)
    head, *tail = name.split("_")
    return head + "".join(t.title() for t in tail) + "(" + rest


# A third group, for the EAGLE head's sequence-cache training (its answers cached apart like the second's):
# more of the code and JSON the head is benchmarked on, in every language and phrasing the first two groups
# combined only partly, plus new signatures and records (none near a fresh evaluation prompt or a preset: no vowel
# counting, dictionary merging, planets, cities, users, primes or CSV reading). The drafters trained before it record the prompts they
# saw (their manifests' `prompts`); `--n-prompts` reproduces them.
SIGNATURES_3 = [
    ("title_words(text)", "capitalizes the first letter of every word of a text"),
    ("sum_of_squares(xs)", "returns the sum of the squares of a list of numbers"),
    ("only_strings(xs)", "keeps only the string values of a list"),
    ("last_word(text)", "returns the last word of a sentence, without punctuation"),
    ("parse_date(s)", "parses a date like '2024-05-17' into a (year, month, day) tuple"),
    ("freq_sorted(words)", "returns the words of a list sorted by how often they occur, most frequent first"),
    ("bucket_scores(scores)", "sorts exam scores into a dictionary of grade letters A to F"),
    ("prefix_sums(xs)", "returns the list of running totals of a list"),
    ("max_gap(xs)", "returns the largest difference between two neighbouring values of a sorted list"),
    ("pad_left(s, width)", "pads a string on the left with zeros up to a given width"),
    ("count_lines(path)", "returns the number of lines of a text file"),
    ("celsius_table(lo, hi)", "returns a list of (celsius, fahrenheit) pairs from lo to hi"),
    ("squares_dict(n)", "returns a dictionary mapping 1..n to their squares"),
    ("drop_every(xs, n)", "drops every n-th element of a list"),
    ("sum_columns(rows)", "sums the columns of a list of equal-length lists of numbers"),
    ("slugify(title)", "turns a title into a lowercase URL slug with hyphens"),
    ("nearest(xs, x)", "returns the value of a list closest to x"),
    ("count_by(items, key)", "counts the dictionaries of a list by the value under one key"),
    ("compact_spaces(s)", "replaces every run of spaces in a string with one space"),
    ("ends_with_any(s, suffixes)", "checks whether a string ends with any of a list of suffixes"),
    ("first_n_primes(n)", "returns the first n prime numbers"),
    ("histogram(xs)", "prints a line of stars for each value of a list"),
    ("fizzbuzz(n)", "returns the FizzBuzz strings from 1 to n"),
    ("capitalize_keys(d)", "returns a copy of a dictionary whose string keys are capitalized"),
    ("dot(a, b)", "returns the dot product of two equal-length lists"),
    ("matrix_sum(m)", "returns the sum of every number in a list of lists"),
    ("weekday_name(n)", "returns the name of the weekday for a number from 0 to 6"),
    ("mean_and_std(xs)", "returns the mean and the standard deviation of a list"),
    ("initials(name)", "returns the initials of a full name, like 'J.R.R.'"),
    ("remove_prefix(s, prefix)", "removes a prefix from a string if it starts with it"),
    ("pairs(xs)", "returns every unordered pair of distinct elements of a list"),
    ("letter_grade(score)", "converts a numeric score from 0 to 100 into a letter grade"),
    ("seconds_to_hms(s)", "formats a number of seconds as 'HH:MM:SS'"),
    ("max_by(items, key)", "returns the dictionary of a list with the largest value under one key"),
    ("evens_squared(xs)", "returns the squares of the even numbers of a list"),
]

FIELDS_3 = [
    ("a train ticket", "passenger, from, to, date, seat and first_class (a boolean)"),
    ("a bank account", "iban, owner, balance, currency and frozen (a boolean)"),
    ("a doctor's appointment", "patient, doctor, date, time and confirmed (a boolean)"),
    ("a smartphone", "brand, model, storage_gb, price and colors (a list of strings)"),
    ("a university course", "code, title, credits, teacher and prerequisites (a list of strings)"),
    ("a rental car", "company, model, days, price_per_day and insurance (a boolean)"),
    ("a podcast", "title, host, episodes, language and topics (a list of strings)"),
    ("a pet", "name, species, age, vaccinated (a boolean) and toys (a list of strings)"),
    ("a restaurant", "name, cuisine, rating, price_level and open_days (a list of strings)"),
    ("a sports team", "name, city, founded, league and players (a list of strings)"),
    ("an invoice", "number, client, date, total and paid (a boolean)"),
    ("a web request log entry", "method, path, status, duration_ms and user_agent"),
    ("a board game", "name, min_players, max_players, minutes and categories (a list of strings)"),
    ("a garden plant", "name, sunlight, water_per_week, perennial (a boolean) and colors (a list of strings)"),
    ("a software release", "version, date, stable (a boolean) and changes (a list of strings)"),
]

VALUES_3 = [
    ("a laptop", "brand, model, ram_gb and price", "a Lenovo ThinkPad X1 with 16 GB at 1499 dollars"),
    ("a person", "name, age, job and hobbies (a list of strings)", "Tomas, 29, a chef who likes cycling and chess"),
    ("a flight", "number, from, to and departure", "flight LH 400 from Frankfurt to New York at 10:35"),
    ("a recipe", "name, servings and ingredients (a list of strings)", "pancakes for four with flour, eggs and milk"),
    ("a movie", "title, year, director and runtime_minutes", "'Up' from 2009 by Pete Docter, 96 minutes"),
    ("a hotel", "name, city, stars and amenities (a list of strings)", "the Grand Hotel in Oslo, 4 stars, a pool and a gym"),
    ("a student", "name, grade, subjects (a list of strings) and passed (a boolean)", "Aiko in grade 9 taking maths and art, passed"),
    ("an event", "title, date, city and speakers (a list of strings)", "PyCon on 14 April in Pittsburgh with Ana and Raj"),
]

PLURAL_FIELDS_3 = [
    ("authors", "name, country and born"),
    ("rivers", "name, length_km and continent"), ("phones", "brand, model and price"),
    ("animals", "name, legs and can_fly (a boolean)"),
    ("products", "id, name and price"), ("movies", "title, director and year"), ("courses", "code, title and credits"),
]


def third() -> list[str]:
    """The third group: every language for the code tasks, new signatures and records, more JSON phrasings."""
    out = [f"Write a {lang} function that {task}." for lang, task in itertools.product(LANGS[6:], TASKS)]
    out += [f"Write a Python function `{sig}` that {task}." for sig, task in SIGNATURES_3]
    out += [f"Write a Python function `{sig}` that {task}. Include a docstring." for sig, task in SIGNATURES_3[::2]]
    out += [f"Write a {lang} function `{_named(sig, lang)}` that {task}." for (sig, task), lang in
            zip(SIGNATURES_3, itertools.cycle(OTHER_LANGS[::-1]))]
    out += [f"Write a Python function `{sig}` that {task}. Keep it short." for sig, task in SIGNATURES[2::3]]
    out += [f"Return a JSON object for {t} with the fields {f}." for t, f in FIELDS_3 + THINGS
            if t not in ("a planet", "a city")]
    out += [f"Give a JSON object describing {t} with {f}." for t, f in FIELDS_3[1::2] + FIELDS[1::2]]
    out += [f"Return a JSON object describing {t} with the fields {f}. Use {v}." for t, f, v in VALUES_3]
    out += [f"Give a JSON array of {n} {p}, each an object with {f} fields." for (p, f), n in
            itertools.product(PLURAL_FIELDS_3, ["two", "three", "five"])]
    out += [f"Give a JSON array of {n} {p}, each an object with {f} fields." for (p, f), n in
            zip(PLURAL_FIELDS, itertools.cycle(["three", "four", "two", "six"]))]
    return out
