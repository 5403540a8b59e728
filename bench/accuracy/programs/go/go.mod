module memdiag.bench/accuracy

go 1.19
