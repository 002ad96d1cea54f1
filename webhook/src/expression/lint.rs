//! The lint CEL-Go has and the interpreter here does not: a run of two unary operators.

/// The column (1-based) of the second operator of the first run of two unary `!` or
/// `-`, outside string literals and comments.
pub(super) fn unary_run(source: &str) -> Option<usize> {
    let chars: Vec<char> = source.chars().collect();
    let mut i = 0;
    // Whether the previous token ends an operand (so a `-` after it is binary).
    let mut after_operand = false;
    // The previous token, when it was a unary operator.
    let mut last_unary: Option<char> = None;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '"' | '\'' => {
                let raw = i > 0 && matches!(chars[i - 1], 'r' | 'R');
                let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
                i += if triple { 3 } else { 1 };
                while i < chars.len() {
                    if !raw && chars[i] == '\\' {
                        i += 2;
                        continue;
                    }
                    if chars[i] == c
                        && (!triple
                            || (chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c)))
                    {
                        i += if triple { 3 } else { 1 };
                        break;
                    }
                    i += 1;
                }
                after_operand = true;
                last_unary = None;
                continue;
            }
            '!' if chars.get(i + 1) == Some(&'=') => {
                i += 2;
                after_operand = false;
                last_unary = None;
                continue;
            }
            '!' | '-' if !(c == '-' && after_operand) => {
                if last_unary == Some(c) {
                    return Some(i + 1);
                }
                last_unary = Some(c);
                after_operand = false;
            }
            '-' => {
                // Binary minus.
                after_operand = false;
                last_unary = None;
            }
            c if c.is_alphanumeric() || c == '_' || c == ')' || c == ']' || c == '}' => {
                after_operand = true;
                last_unary = None;
            }
            _ => {
                after_operand = false;
                last_unary = None;
            }
        }
        i += 1;
    }
    None
}
