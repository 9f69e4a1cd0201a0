def main(argv=None):
    print("zephon-dask")
