"""Plans in review: diff, the --check lockfile, check-plans and its manifest."""
