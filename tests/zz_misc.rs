use session_store::*;
#[test]
fn misc() {
    println!("{} {}", utc(i64::MIN), utc(i64::MAX));
    println!("{}", quoted(""));
    let c = CancelToken::after(std::time::Duration::MAX);
    println!("{}", c.is_cancelled());
    println!("{:?}", SearchOptions::default().with_limit(usize::MAX));
    println!("{:?}", ListFilter::default().with_since_ms(i64::MIN));
    println!("{:?}", GcOptions::older_than(std::time::Duration::MAX));
    let d = tempfile::tempdir().unwrap();
    let r = Root::with_options(
        d.path().join("r"),
        StoreOptions::default().with_queue_budget(1),
    )
    .unwrap();
    let s = r.create(CreateOptions::default()).unwrap();
    for i in 0..5 {
        s.append(Batch::new(
            format!("o{i}"),
            vec![Event::new("diagnostic").optional()],
        ))
        .unwrap();
    }
    println!("{:?}", s.sequences());
    println!(
        "{:?}",
        r.list_filtered(
            &ListFilter::default().with_since_ms(i64::MIN),
            None,
            usize::MAX
        )
        .map(|l| l.entries.len())
    );
    println!(
        "{:?}",
        r.list_filtered(&ListFilter::default().with_since_ms(i64::MAX), None, 0)
            .map(|l| l.entries.len())
    );
    println!(
        "{:?}",
        r.gc(&GcOptions::older_than(std::time::Duration::MAX))
            .map(|g| format!("{g:?}"))
            .map_err(|e| e.to_string())
    );
    println!(
        "{:?}",
        r.gc(&GcOptions::older_than(std::time::Duration::ZERO).with_dry_run(true))
            .map(|g| format!("{g:?}").chars().take(100).collect::<String>())
            .map_err(|e| e.to_string())
    );
}
