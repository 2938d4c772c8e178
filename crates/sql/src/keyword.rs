//! Case-insensitive keyword matching without allocation.

/// Longest word worth uppercasing; every keyword and function name we look for is shorter.
const MAX_KEYWORD_LEN: usize = 40;

/// A word uppercased into a stack buffer, for `match`ing against byte-string keywords.
pub(crate) struct Upper {
    buf: [u8; MAX_KEYWORD_LEN],
    len: usize,
}

impl Upper {
    /// The uppercased word, or an empty slice if the word was too long to be a keyword.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Uppercases `word` (ASCII only). Words longer than any keyword come back empty.
pub(crate) fn upper(word: &[u8]) -> Upper {
    let mut out = Upper {
        buf: [0; MAX_KEYWORD_LEN],
        len: 0,
    };
    if word.len() <= MAX_KEYWORD_LEN {
        for (dst, src) in out.buf.iter_mut().zip(word) {
            *dst = src.to_ascii_uppercase();
        }
        out.len = word.len();
    }
    out
}

/// A set of uppercased words: the list `$list` (for tests and documentation) and the
/// membership test `$test`, a `match` (length switch and inline compares: a few
/// nanoseconds, no search).
macro_rules! word_set {
    ($(#[$doc:meta])* $list:ident, $test:ident: [$($word:literal),* $(,)?]) => {
        $(#[$doc])*
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) const $list: &[&[u8]] = &[$($word),*];

        /// True for an uppercased word of the set.
        pub(crate) fn $test(upper: &[u8]) -> bool {
            matches!(upper, $($word)|*)
        }
    };
}

#[rustfmt::skip]
word_set! {
    /// Reserved words that may stand before `(` in a read: syntax (`IN (`, `AS (`, `JOIN (`,
    /// `CAST(x AS DECIMAL(`) or built-ins without side effects (`IF(`, `LEFT(`, `MOD(`,
    /// `CONVERT(`, `DATABASE(`, `CURRENT_DATE(`...). Being reserved, none can name a stored
    /// function, quoted names aside. Sorted.
    SYNTAX, is_syntax_before_paren: [
        b"ALL", b"AND", b"AS", b"BETWEEN", b"BINARY", b"BY", b"CASE", b"CHAR", b"CONVERT",
        b"CURRENT_DATE", b"CURRENT_TIME", b"CURRENT_TIMESTAMP", b"DATABASE", b"DEC", b"DECIMAL",
        b"DEFAULT", b"DISTINCT", b"DISTINCTROW", b"DIV", b"DOUBLE", b"ELSE", b"EXCEPT", b"EXISTS",
        b"FLOAT", b"FOR", b"FROM", b"HAVING", b"IF", b"IN", b"INDEX", b"INSERT", b"INTERSECT",
        b"INTERVAL", b"IS", b"JOIN", b"KEY", b"LEFT", b"LIKE", b"LOCALTIME", b"LOCALTIMESTAMP",
        b"MATCH", b"MOD", b"NOT", b"NUMERIC", b"ON", b"OR", b"PARTITION", b"REGEXP", b"REPEAT",
        b"REPLACE", b"RIGHT", b"RLIKE", b"SCHEMA", b"SELECT", b"THEN", b"UNION", b"USING",
        b"UTC_DATE", b"UTC_TIME", b"UTC_TIMESTAMP", b"VALUES", b"VARBINARY", b"VARCHAR", b"WHEN",
        b"WHERE", b"WITH", b"XOR",
    ]
}

#[rustfmt::skip]
word_set! {
    /// Built-in functions (not reserved words) that are safe to run twice: no side effects, and
    /// an answer that depends only on the arguments, the data read, the session variables
    /// holdfast restores and the clock or random generator (`NOW()`, `RAND()`, `UUID()`: a
    /// statement run again gives another answer, but the client only ever sees one). Not here:
    /// anything with effects (`GET_LOCK`, `SLEEP`, `NEXTVAL`...), anything that reads the
    /// connection's own history (`LAST_INSERT_ID`, `FOUND_ROWS`, `ROW_COUNT`, `LASTVAL`,
    /// `CONNECTION_ID`...), and the long tail nobody needs retried. Sorted.
    PURE, is_pure_function: [
        b"ABS", b"ADDDATE", b"ASCII", b"AVG", b"CAST", b"CEIL", b"CEILING", b"CHARACTER_LENGTH",
        b"CHAR_LENGTH", b"COALESCE", b"CONCAT", b"CONCAT_WS", b"COUNT", b"CURDATE", b"CURTIME",
        b"DATE", b"DATEDIFF", b"DATE_ADD", b"DATE_FORMAT", b"DATE_SUB", b"DAY", b"DAYOFMONTH",
        b"DAYOFWEEK", b"DAYOFYEAR", b"DENSE_RANK", b"EXTRACT", b"FIELD", b"FIND_IN_SET", b"FLOOR",
        b"FORMAT", b"FROM_UNIXTIME", b"GREATEST", b"GROUP_CONCAT", b"HEX", b"HOUR", b"IFNULL",
        b"INSTR", b"ISNULL", b"JSON_EXTRACT", b"JSON_UNQUOTE", b"JSON_VALUE", b"LAST_DAY", b"LCASE",
        b"LEAST", b"LENGTH", b"LOCATE", b"LOWER", b"LPAD", b"LTRIM", b"MAX", b"MD5", b"MID", b"MIN",
        b"MINUTE", b"MONTH", b"NOW", b"NULLIF", b"POSITION", b"POWER", b"RAND", b"RANK", b"REVERSE",
        b"ROUND", b"ROW", b"ROW_NUMBER", b"RPAD", b"RTRIM", b"SECOND", b"STR_TO_DATE", b"SUBDATE",
        b"SUBSTR", b"SUBSTRING", b"SUBSTRING_INDEX", b"SUM", b"TIME", b"TIMEDIFF", b"TIMESTAMP",
        b"TIMESTAMPADD", b"TIMESTAMPDIFF", b"TIME_FORMAT", b"TRIM", b"TRUNCATE", b"UCASE", b"UNHEX",
        b"UNIX_TIMESTAMP", b"UPPER", b"UUID", b"WEEK", b"WEEKDAY", b"YEAR",
    ]
}
