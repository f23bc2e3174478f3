"""Small fixed word lists for synthetic prompts (needle keys, record entities and values)."""

ADJECTIVES = (
    "amber ancient bold brave bright calm clever crimson curious daring dusty eager early faint fancy fierce gentle "
    "gilded glad golden grand hidden hollow humble icy jolly keen lively lone lucky mellow merry misty modest narrow "
    "noble odd pale patient plain polished proud quick quiet rapid rare restless rough royal rustic sandy scarlet secret "
    "shy silent silver simple sleepy smooth snowy solemn steady stern stormy sunny swift tame tidy tiny true velvet vivid "
    "wandering warm wild windy wise witty young zealous"
).split()

NOUNS = (
    "anchor apple arrow badger barrel beacon bell birch bridge brook candle canyon castle cedar cloud comet copper "
    "crane crystal dagger dolphin dragon eagle ember falcon feather fern forest fountain fox garden glacier harbor hawk "
    "hazel heron island ivy jackal kettle lantern lark lemon lily lotus maple meadow mirror moon mountain needle oak "
    "orchard otter owl panther pearl pebble pepper pine planet pond quill rabbit raven river robin saddle salmon "
    "sparrow spruce star stone storm sunset thistle thunder tiger torch tower valley violet walrus willow wolf zephyr"
).split()

CITIES = (
    "Lisbon Oslo Cairo Lima Dublin Quito Riga Seoul Tunis Vienna Porto Bergen Accra Bogota Hanoi Krakow Nairobi Perth "
    "Quebec Santiago Tallinn Utrecht Valencia Windhoek Zagreb Ankara Bilbao Cusco Dakar Geneva Havana Kyoto Lyon Malmo "
    "Napier Odessa Padua Rabat Sapporo Toledo"
).split()

COLORS = "red orange yellow green blue indigo violet black white grey brown pink teal maroon olive navy".split()

FIRST_NAMES = (
    "Ada Alan Bruno Clara Dora Elena Felix Grace Hugo Ines Jonas Karin Leo Mira Nora Oscar Paula Quinn Rosa Sven Tara Umar Vera Walt Xenia Yusuf Zoe"
).split()
