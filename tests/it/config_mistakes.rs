//! Every mistake of a file in one run: unknown keys, values of the wrong type and
//! unknown names are all reported, each at its line, in line order, and nothing is
//! said twice about a value already reported (the first pass's stand-in values).

use crate::config_errors::{assert_error, assert_one_error, errors};

/// Unknown keys, mistyped values and bad names in one file: all reported in one run,
/// each at its line, and nothing said twice about a value already reported.
#[test]
fn every_mistake_of_a_file_is_reported_at_once() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limt:
      unit: second
      requests_per_unit: 5
  - key: b
    rate_limit:
      unit: minuet
      requests_per_unit: 5
  - key: c
    rate_limit:
      unit: second
      algorithm: token_bukket
      requests_per_unit: 5
  - key: e
    shadow_mode: maybe
    rate_limit:
      algorithm: token_bucket
      unit: second
      requests_per_unit: ten
";
    let all = errors(yaml);
    assert_eq!(all.len(), 5, "{all:#?}");
    // In line order, whichever pass found them.
    assert_error(&all[0], "test.yaml", 4, &["unknown key 'rate_limt'"]);
    assert_error(
        &all[1],
        "test.yaml",
        9,
        &["descriptor 'b'", "unit", "'minuet'"],
    );
    assert_error(
        &all[2],
        "test.yaml",
        14,
        &["descriptor 'c'", "algorithm", "'token_bukket'"],
    );
    assert_error(&all[3], "test.yaml", 17, &["shadow_mode", "got 'maybe'"]);
    assert_error(
        &all[4],
        "test.yaml",
        21,
        &["requests_per_unit", "got 'ten'"],
    );
}

#[test]
fn a_value_of_the_wrong_type_is_reported_once() {
    // A list for the domain: the rest of the file is still checked.
    let yaml = "domain: [d]
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
";
    let all = errors(yaml);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert_error(
        &all[0],
        "test.yaml",
        1,
        &["domain: expected text (got a list)"],
    );
    assert_error(&all[1], "test.yaml", 4, &["fortnight"]);
    // A unit given as a mapping: one error, not a second one for the unit it lacks.
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: {every: second}, requests_per_unit: 1}
";
    assert_one_error(yaml, 4, &["unit: expected text (got a mapping)"]);
}
