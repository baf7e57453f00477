"""Compact word lists for name detection: common given names across languages, and capitalised
words that start or follow names in code but are not names (organisations, doc words, months).

The given-name list is only used where context is weak (prose like "thanks to Ana Ruiz");
strong contexts (author fields, copyright lines, `Name <email>`) need no lexicon. Given names that
are also common English words (Will, Mark, May, Grace, Bill, Page …) are left out on purpose.
"""

from __future__ import annotations

FIRST_NAMES = frozenset("""
aaron abdul abigail adam adrian ahmed aisha akira alan albert alejandro alex alexander alexandra
alexei alice alicia alina amanda amelia amir amit amy ana anders andrea andreas andrew andrei
andres angela anil anna anne anthony anton antonio arjun arthur ashley ayesha barbara ben
benjamin bernard bjorn brandon brian bruno carla carlos carmen caroline catherine charles
charlotte chen chloe chris christian christina christine christopher claire claudia colin
craig cristina daniel daniela david deborah deepak denis dennis diana diego dimitri dmitry
dominic donald douglas eduardo edward elena elias elizabeth ellen emily emma eric erik ethan
eva evelyn fabian fatima felipe felix fernando florian francesca francesco francisco frank
fred frederick gabriel gabriela george georg gerhard giovanni giulia gregory guillaume gustavo
hannah hans harold harry hassan heather helen helena henrik henry hiroshi hugo ibrahim igor
ines isaac isabel isabella ivan jack jacob jakub james jan jane janet jason javier jean
jennifer jeremy jessica jiang jin joan joao joel johan johannes john jonas jonathan jorge jose
joseph joshua juan julia julian julie jun justin kai karen karl katarina kate katherine kenji
kevin kim klaus kumar lars laura lauren lei leo leon li liam linda lisa lorenzo louis lucas
lucia luis luca lukas magnus manuel marco marcus margaret maria marie marina mario marta martin
mary mateo matteo matthew matthias max maxim mei melissa michael michel michelle miguel mikhail
ming mohammed mohamed monica nadia naomi natalia natasha nathan nicholas nicolas nikita nikolai
nina noah nora olga oliver olivia omar oscar pablo patricia patrick paul paula pedro peter
philip philipp pierre pietro priya rachel rafael rahul raj rajesh ramon raul rebecca ricardo
richard robert roberto robin roman ruth ryan sabrina sam samantha samuel sandra sara sarah
scott sean sebastian sergei sergey shreya simon sofia sophia sophie stefan stefano stephen
steven susan sven takeshi tanaka tatiana thomas tim timothy tobias tom tomas tyler valentina
vanessa victor victoria vikram vincent vladimir wang wei william wolfgang xavier xin yan yang
yuki yusuf yuri zhang zoe
bob bobby carol dave joe jim tony nancy betty dorothy sharon cynthia kathleen brenda pamela
debra stephanie joyce diane gloria teresa doris judith janice kenneth ronald jeffrey larry jerry
walter keith roger terry gerald carl randy howard eugene russell todd shawn phillip ralph ernest
sylvia lena ingrid astrid greta jens nils
""".split())

# Trailing words that make a "holder" an organisation rather than a person.
ORG_WORDS = frozenset("""
inc inc. llc ltd ltd. limited corp corp. corporation company co co. foundation authors
contributors project projects team teams gmbh ag sa s.a. bv b.v. plc pty holdings software
technologies technology labs lab laboratory university institute group systems developers
organization organisation association society consortium networks microsystems services
solutions studio studios community partners trust council agency media industries
stichting centrum
""".split())

# Capitalised words that are never part of a person's name in our contexts.
NOT_NAME_WORDS = frozenset("""
the this that these those it its if in on at of for and or but not no all any some see note
use add fix update remove merge version license licensed copyright apache mit bsd gnu general
public software free python java javascript typescript google microsoft linux windows macos
readme todo returns return args arguments raises example error exception true false none null
date time monday tuesday wednesday thursday friday saturday sunday january february march april
june july august september october november december world team everyone all sir madam there
folks guys friends maintainers customer user admin support hello hi dear thanks regards best
cheers sincerely yours reviewed signed author authors name names file files test tests build
release notes changelog license new open source project api http https json yaml url id
default config settings server client module package class function method docs documentation
county square island avenue road center centre station airport college school hospital
mountain village criterion award awards prize cloth pins check patri army enterprises formula
cake signs sends encrypts decrypts encrypted decrypted writes reads receives wants says chooses
computes verifies responds audits checks generates publishes commits reveals picks selects
obtains replies forwards requests proves learns knows gets
feb mar apr jul aug sep sept oct nov dec by somebody someone anybody nobody
width height length size context lines line depth level limit count value number
""".split())


TITLES = frozenset("mr mr. mrs mrs. ms ms. dr dr. prof prof. sir".split())
PARTICLES = frozenset("van von de der den da di del della la le du dos das bin al ten ter".split())
