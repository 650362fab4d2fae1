use serde::Deserialize;

use super::{At, Kind, Value, from_tree, parse};

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Sample {
    text: Option<At<String>>,
    number: Option<At<u32>>,
    flag: Option<bool>,
    list: Option<Vec<At<String>>>,
}

fn sample(source: &str) -> Result<Sample, super::Error> {
    from_tree(&parse(source).unwrap())
}

#[test]
fn text_is_the_scalar_as_written_and_numbers_read_as_serde_saphyr_reads_them() {
    let s = sample("text: 007\nnumber: \"0x10\"\nflag: yes\n").unwrap();
    assert_eq!(
        s.text.unwrap(),
        At {
            value: "007".into(),
            line: 1
        }
    );
    assert_eq!(s.number.unwrap(), At { value: 16, line: 2 });
    assert_eq!(s.flag, Some(true));
    for (text, written) in [
        ("1.50", "1.50"),
        ("True", "True"),
        ("+7", "+7"),
        ("'q'", "q"),
    ] {
        let s = sample(&format!("text: {text}\n")).unwrap();
        assert_eq!(s.text.unwrap().value, written);
    }
    let s = sample("number: 1_000\nflag: \"on\"\n").unwrap();
    assert_eq!(s.number.unwrap().value, 1000);
    assert_eq!(s.flag, Some(true));
}

#[test]
fn lines_follow_aliases_to_where_they_are_used() {
    let source = "base: &b x\nlist:\n  - *b\n  - y\ntext: *b\n";
    let tree = parse(source).unwrap();
    let Value::Map(entries) = &tree.value else {
        panic!("{tree:?}")
    };
    assert_eq!(entries[2].1.line, 5);
    let Value::Scalar(s) = &entries[2].1.value else {
        panic!("{tree:?}")
    };
    assert_eq!((s.kind, s.text.as_str()), (Kind::Str, "x"));
    #[derive(Deserialize)]
    struct Lists {
        list: Vec<At<String>>,
        #[serde(rename = "base")]
        _base: String,
        #[serde(rename = "text")]
        _text: String,
    }
    let lists: Lists = from_tree(&tree).unwrap();
    let lines: Vec<(u64, &str)> = lists
        .list
        .iter()
        .map(|a| (a.line, a.value.as_str()))
        .collect();
    assert_eq!(lines, [(3, "x"), (4, "y")]);
}

#[test]
fn what_the_schema_refuses_names_the_line() {
    let e = sample("text: a\nnumber: ten\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("got 'ten'"), "{e:?}");
    let e = sample("text: a\n\nbogus: 1\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.starts_with("unknown key 'bogus'"), "{e:?}");
    let e = sample("list: {a: b}\n").unwrap_err();
    assert_eq!(e.line, Some(1));
    assert!(e.message.contains("expected a list"), "{e:?}");
}

#[test]
fn empty_values_are_absent() {
    let s = sample("text:\nnumber: ~\nflag: null\n").unwrap();
    assert_eq!(
        s,
        Sample {
            text: None,
            number: None,
            flag: None,
            list: None
        }
    );
}
