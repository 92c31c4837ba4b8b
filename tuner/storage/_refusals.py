"""What a PostgreSQL server whose `lc_messages` is not English says when it refuses a new connection for a
connection limit (SQLSTATE 53300, too_many_connections), from PostgreSQL's own message catalogs
(`postgres-15.mo`; PostgreSQL 16's two reserved-slot messages from its 16/17 catalogs, `src/backend/po/`):
its max_connections, the role's and the database's CONNECTION LIMIT, the slots reserved for superusers
(PostgreSQL 16: for roles with the SUPERUSER attribute, or with the privileges of the
pg_use_reserved_connections role). libpq gives no SQLSTATE for a refusal that ends the connection's
start, and the server writes it in the language its own configuration sets (the role's, the database's
or the client's `lc_messages` take effect only after these checks), so its text is all there is to read.

`%s` stands for the role's or database's name, the attribute (SUPERUSER) or the role
(pg_use_reserved_connections); a message matches when every other part of a translation
(quotes left out) is in it. Imported only when a connection was refused."""

from __future__ import annotations

from functools import cache

__all__ = ["LOCALIZED_LIMIT_REFUSALS", "localized_limit_refusal"]

# language -> its messages: max_connections, role limit, database limit, then the reserved-slot ones
# (PostgreSQL 15's; 16's for the SUPERUSER attribute and for pg_use_reserved_connections's privileges,
# where translated; fr, it, ko, ru, uk, zh_CN, zh_TW have none here yet: no 16+ catalog of theirs was read).
# Only the set of messages matters, not their order or number.
LOCALIZED_LIMIT_REFUSALS: dict[str, tuple[str, ...]] = {
    "de": (
        "tut mir leid, schon zu viele Verbindungen",
        "zu viele Verbindungen von Rolle »%s«",
        "zu viele Verbindungen für Datenbank »%s«",
        "die verbleibenden Verbindungen sind für Superuser auf Nicht-Replikationsverbindungen reserviert",
        "die verbleibenden Verbindungen sind für Rollen mit dem %s-Attribut reserviert",
        "die verbleibenden Verbindungen sind für Rollen mit den Privilegien der Rolle »%s« reserviert",
    ),
    "es": (
        "lo siento, ya tenemos demasiados clientes",
        "demasiadas conexiones para el rol «%s»",
        "demasiadas conexiones para la base de datos «%s»",
        "las conexiones restantes están reservadas a superusuarios y no de replicación",
        "las conexiones restantes están reservadas a roles con el atributo %s",
        "las conexiones restantes están reservadas a roles con privilegios del rol «%s»",
    ),
    "fr": (
        "désolé, trop de clients sont déjà connectés",
        "trop de connexions pour le rôle « %s »",
        "trop de connexions pour la base de données « %s »",
        "les emplacements de connexions restants sont réservés pour les connexions superutilisateur non "
        "relatif à la réplication",
    ),
    "it": (
        "spiacente, troppi client già connessi",
        'troppe connessioni per il ruolo "%s"',
        'troppe connessioni al database "%s"',
        "i rimanenti slot di connessione sono riservati a connessioni di superutenti non di replica",
    ),
    "ja": (
        "現在クライアント数が多すぎます",
        'ロール"%s"からの接続が多すぎます',
        'データベース"%s"への接続が多すぎます',
        "残りの接続スロットはレプリケーションユーザーではないスーパーユーザー用に予約されています",
        "残りの接続枠は%s属性を持つロールのために予約されています",
        '残りの接続枠は"%s"ロールの権限を持つロールのために予約されています',
    ),
    "ka": (
        "უკაცრავად, უკვე მეტისმეტად ბევრი კლიენტია",
        'მეტისმეტად ბევრი კავშირი როლისთვის "%s"',
        'ძალიან ბევრი კავშირი ბაზისთვის "%s"',
        "დარჩენილი მიერთების სლოტები დაცულია %s ატრიბუტის მქონე როლებისთვის",
        "დარჩენილი მიერთების სლოტები დაცულია %s როლის პრივილეგიების მქონე როლებისთვის",
    ),
    "ko": (
        "최대 동시 접속자 수를 초과했습니다.",
        '"%s" 롤의 최대 동시 접속수를 초과했습니다',
        '"%s" 데이터베이스 최대 접속수를 초과했습니다',
        "남은 연결 슬롯은 non-replication 슈퍼유저 연결용으로 남겨 놓았음",
    ),
    "ru": (
        "извините, уже слишком много клиентов",
        'слишком много подключений для роли "%s"',
        'слишком много подключений к БД "%s"',
        "оставшиеся слоты подключений зарезервированы для подключений суперпользователя (не для репликации)",
    ),
    "sv": (
        "ledsen, för många klienter",
        'för många uppkopplingar för roll "%s"',
        'för många uppkopplingar till databasen "%s"',
        "resterande anslutningsslottar är reserverade för superuser-anslutningar utan replikering",
        "resterande anslutningsslottar är reserverade för roller med attributet %s",
        'resterande anslutningsslottar är reserverade för roller med rättigheter från rollen "%s"',
    ),
    "uk": (
        "вибачте, вже забагато клієнтів",
        'занадто багато підключень для ролі "%s"',
        'занадто багато підключень до бази даних "%s"',
        "слоти підключень, які залишились, зарезервовані для підключень суперкористувача (не для реплікації)",
    ),
    "zh_CN": (
        "客户端连接过多",
        '角色 "%s" 的连接过多',
        '数据库 "%s" 的连接过多',
        "剩余连接槽位保留给超级用户的非复制连接",
    ),
    "zh_TW": (
        "抱歉，客戶端過多",
        '角色 "%s" 的連線太多',
        '資料庫 "%s" 的連線太多',
        "剩餘的連線槽保留給非複寫的超級使用者連線",
    ),
}

_QUOTES = " \"'«»“”„»«›‹「」『』"


def _parts(message: str) -> tuple[str, ...]:
    """The parts of a translation a refusal contains whatever the name in it: split at `%s`, its
    whitespace as one space (libpq's message may break a line), its quotes left out."""
    return tuple(p for p in (" ".join(s.split()).strip(_QUOTES) for s in message.split("%s")) if p)


@cache
def _all_parts() -> tuple[tuple[str, ...], ...]:
    return tuple(_parts(m) for messages in LOCALIZED_LIMIT_REFUSALS.values() for m in messages)


def localized_limit_refusal(said: str) -> bool:
    """`said` (a driver's message for a connection that could not be made) is a translated refusal for a
    connection limit."""
    text = " ".join(said.split())
    return any(all(p in text for p in parts) for parts in _all_parts())
